"""``python -m mpidp.bench guard [--iters N] [--runs R]``: what the checks on a call cost.

Under ``mpiexec -n N``. Two figures for the always-on guard (the call's signature
folded into its tags, `mpidp.collectives.state.signature`), one for the opt-in
agreement check (``MPIDP_DEBUG=1``):

- isolation: the signature and the tag of one 8-byte float32 all-reduce, computed
  a million times on one rank (``timeit``), minus an empty loop;
- end to end: an 8-byte all-reduce (ring) timed with the guard and without it
  (signature 0: the plain slot), the two interleaved call by call so that a
  passing disturbance hits both alike; medians over the iterations, then the
  median of `--runs` runs; and the same with the agreement check on.

Times are the slowest rank's, per call, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

import numpy as np
from mpi4py import MPI

from mpidp.bench.output import HelpFormatter
from mpidp.collectives import api, checks, plan
from mpidp.collectives.state import CommState, signature

SIG_ARGS = ("allreduce", 2, np.dtype("float32"), "sum", "ring", None)  # as plan.Call.tag


def isolation_ns(number: int = 1_000_000) -> float:
    """Nanoseconds per call of signature + tag (remembered signatures: the steady state)."""
    st = CommState(tag_ub=(1 << 29) - 1)
    guarded = timeit.timeit(lambda: st.tag(5, signature(*SIG_ARGS)), number=number)
    plain = timeit.timeit(lambda: st.tag(5, 0), number=number)
    return (guarded - plain) / number * 1e9


def one_call(comm, x, y) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    api.allreduce(comm, x, y, algorithm="ring")
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def end_to_end(comm, iters: int) -> dict[str, float]:
    """Median µs per 8-byte all-reduce: guarded, unguarded, with the agreement check."""
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)
    variants = {"guard": lambda: None, "no guard": lambda: None, "MPIDP_DEBUG=1": lambda: None}
    times = {name: [] for name in variants}
    real = plan.signature
    for i in range(iters + 20):  # 20 warm-up calls
        for name in variants:
            plan.signature = (lambda *a: 0) if name == "no guard" else real
            checks.set_debug(name == "MPIDP_DEBUG=1")
            t = one_call(comm, x, y)
            if i >= 20:
                times[name].append(t)
    plan.signature = real
    checks.set_debug(False)
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidp.bench guard", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--iters", type=int, default=2000, help="timed calls per run")
    parser.add_argument("--runs", type=int, default=3, help="runs (the median is reported)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    iso = isolation_ns()
    runs = [end_to_end(comm, args.iters) for _ in range(args.runs)]
    if comm.Get_rank() == 0:
        print(f"ranks {comm.Get_size()}, {args.runs} runs of {args.iters} interleaved calls "
              "(8-byte float32 all-reduce, ring); per call, slowest rank, median")
        print(f"guard in isolation (signature + tag): {iso:.0f} ns")
        for name in runs[0]:
            each = [r[name] for r in runs]
            print(f"{name:>14}: {statistics.median(each):7.2f} µs  (runs: "
                  f"{', '.join(f'{v:.2f}' for v in each)})")
        diffs = [r["guard"] - r["no guard"] for r in runs]
        debug = [r["MPIDP_DEBUG=1"] - r["guard"] for r in runs]
        print(f"guard, end to end: {statistics.median(diffs) * 1e3:+.0f} ns per call "
              f"(runs: {', '.join(f'{d * 1e3:+.0f}' for d in diffs)})")
        print(f"agreement check (MPIDP_DEBUG=1): {statistics.median(debug):+.2f} µs per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
