"""The flight recorder's cost on the per-call path: an 8 B all-reduce, recorder on and off.

    mpiexec -n 2 python -m mpidp.bench.flight [--calls 20000] [--reps 3]

On and off runs alternate (on, off, on, off, ...) on one communicator, so that a
machine whose load changes affects both alike; each run times `calls` blocking
all-reduces of one float64 and reports the median per-call time of its rank 0.
The printed figures are the medians over `reps` runs of each, their difference, and
the median of the differences of each on run and the off run after it.

    valgrind --tool=callgrind python -m mpidp.bench.flight --only on --calls 2000

runs the calls once, untimed, with the recorder on (or ``off``): the instructions of
two such runs (``--calls 0`` and ``--calls 2000``) differ by 2000 calls' worth, a
count the machine's load does not move (docs/benchmarks-notes.md).

    mpiexec -n 2 python -m mpidp.bench.flight --opcodes [--calls 200]

counts the bytecodes one call executes on rank 0 (`sys.settrace` with opcode events),
recorder on and off, the same call planned (its schedule set aside: `blocking`), and a
persistent one's replayed start and wait, and prints them per function: a second count
no load moves.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from .. import cli
from .. import collectives as mp
from ..collectives.schedules import PLANNED, Schedule
from ..collectives.state import state

# The timed loop is compiled as a program's own code (its file is not under mpidp/), as
# in a user's script: the recorder walks up to the first frame outside mpidp, and from
# a loop inside mpidp it would walk up to runpy, which no program pays for.
_LOOP = """
def per_call(comm, x, calls):
    times = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter()
        mp.allreduce(comm, mp.IN_PLACE, x, op=MPI.MAX, algorithm="recursive_doubling")
        times[i] = time.perf_counter() - t
    return float(np.median(times)), float(np.percentile(times, 5))

def starts(req, calls):
    for _ in range(calls):
        req.Start()
        req.Wait()
"""
_ns = {"np": np, "time": time, "mp": mp, "MPI": MPI}
exec(compile(_LOOP, "<a program>", "exec"), _ns)
per_call, starts = _ns["per_call"], _ns["starts"]


def opcodes(run, *args) -> collections.Counter:
    """The bytecodes ``run(*args)`` executes on this rank, by function (file:name)."""
    counts: collections.Counter = collections.Counter()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_qualname}"] += 1
        return trace

    sys.settrace(trace)
    try:
        run(*args)
    finally:
        sys.settrace(None)
    return counts


def _print_opcodes(comm, x, calls: int, st, recorder) -> None:
    st.flight = recorder
    on = opcodes(per_call, comm, x, calls)
    st.flight = None
    off = opcodes(per_call, comm, x, calls)
    st.flight = recorder
    kept = dict(st.schedules)  # the call's schedule set aside: it is planned (`blocking`)
    st.schedules.update(dict.fromkeys(kept, PLANNED))
    planned = opcodes(per_call, comm, x, calls)
    st.schedules.update(kept)
    req = mp.allreduce_init(comm, x, np.empty_like(x))  # (out of place, auto)
    starts(req, 50)  # the first start recorded, the others replayed
    persistent = opcodes(starts, req, calls)
    req.Free()
    if comm.Get_rank() != 0:
        return
    a, b = sum(on.values()) / calls, sum(off.values()) / calls
    print(f"8 B all-reduce, rank 0 of {comm.Get_size()}, {calls} calls: {a:.0f} opcodes a "
          f"call with the recorder, {b:.0f} without: {a - b:.0f} ({(a - b) / a:.1%}) the "
          "recorder's. Where they differ (opcodes a call, on - off):")
    for name in sorted(set(on) | set(off), key=lambda k: off[k] - on[k]):
        d = (on[name] - off[name]) / calls
        if abs(d) >= 0.5:
            print(f"  {d:+6.1f}  {name}")
    replayed = any(isinstance(v, Schedule) for v in kept.values())
    print(f"the same call {'replayed' if replayed else 'planned (nothing replays here)'}, "
          f"recorder on, by function; planned every time: "
          f"{sum(planned.values()) / calls:.0f} opcodes")
    for name, n in on.most_common():
        if n / calls >= 0.5:
            print(f"  {n / calls:6.1f}  {name}")
    print(f"a persistent one's replayed Start + Wait (out of place, auto), recorder on: "
          f"{sum(persistent.values()) / calls:.0f} opcodes, by function:")
    for name, n in persistent.most_common():
        if n / calls >= 0.5:
            print(f"  {n / calls:6.1f}  {name}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpidp.bench.flight")
    p.add_argument("--calls", type=cli.number(int, 0), default=None,
                   help="calls a run (default 20000; with --opcodes 200)")
    p.add_argument("--reps", type=cli.number(int, 1), default=3)
    p.add_argument("--only", choices=("on", "off"),
                   help="run the calls once, untimed, the recorder on or off (for valgrind)")
    p.add_argument("--opcodes", action="store_true",
                   help="count the bytecodes a call executes, recorder on and off")
    args = p.parse_args(argv)
    calls = args.calls if args.calls is not None else 200 if args.opcodes else 20000
    if calls == 0 and not args.only:
        p.error("--calls must be at least 1 here (0 only with --only, for valgrind)")
    comm = MPI.COMM_WORLD.Dup()
    x = np.ones(1)
    st = state(comm)
    recorder = st.flight
    per_call(comm, x, 50 if args.only else 1000)  # warm-up (set-up, the call site found)
    if args.opcodes:
        _print_opcodes(comm, x, calls, st, recorder)
        comm.Free()
        return 0
    if args.only:
        st.flight = recorder if args.only == "on" else None
        if calls:
            per_call(comm, x, calls)
        comm.Free()
        return 0
    on, off = [], []
    for _ in range(args.reps):
        for mode, out in ((recorder, on), (None, off)):
            st.flight = mode
            comm.Barrier()
            out.append(per_call(comm, x, calls))
    # the 5th percentile of each run's calls: what a call costs when the machine lets it
    on5, off5 = [v[1] for v in on], [v[1] for v in off]
    on, off = [v[0] for v in on], [v[0] for v in off]
    st.flight = recorder
    if comm.Get_rank() == 0:
        a, b = statistics.median(on), statistics.median(off)
        pair = statistics.median(x - y for x, y in zip(on, off, strict=True))  # on vs the next off
        print(f"8 B all-reduce, {comm.Get_size()} ranks, median of {args.reps} runs of "
              f"{calls} calls: recorder on {a * 1e6:.2f} us, off {b * 1e6:.2f} us, "
              f"cost {(a - b) * 1e6:+.2f} us ({(a - b) / b:+.1%}), median of paired "
              f"differences {pair * 1e6:+.2f} us; on {[round(v * 1e6, 2) for v in on]}, "
              f"off {[round(v * 1e6, 2) for v in off]}; 5th percentiles: on "
              f"{statistics.median(on5) * 1e6:.2f} us, off {statistics.median(off5) * 1e6:.2f} us "
              f"({(statistics.median(on5) - statistics.median(off5)) * 1e6:+.2f} us)")
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
