"""``python -m mpidp.bench collectives``: every algorithm against the MPI library, nccl-tests style.

    mpiexec -n 4 python -m mpidp.bench collectives [--max 64MiB] [--inplace both]
        [--json FILE] [--csv FILE] [--plot FILE.png]

For all-reduce, reduce-scatter (block), all-gather and broadcast, and for sizes
doubling from ``--min`` to ``--max``, one run times side by side: the MPI
library's own call through mpi4py ("native") and every mpidp algorithm of
``mpidp.ALGORITHMS`` including ``auto`` (the table shows what auto resolved to),
the persistent forms (native ``*_init`` and mpidp's) and, where PyTorch is
installed, ``torch.distributed``'s gloo backend (rows ``"gloo"``; see peers.py).

Method (as nccl-tests and the OSU micro-benchmarks):

- buffers are allocated once, at the largest size; each size uses views of them;
- per size: warm-up iterations, then timed ones; an iteration runs native and
  every algorithm once each, in turn (so a disturbance hits them alike; the
  order rotates by one per iteration, so each follows each other alike), each
  call starting at a barrier, its time the slowest rank's; the table shows the
  median and the minimum over the timed iterations;
- every result, warm-up included, is compared with the native result for the
  same input (inputs are small integers, so the answer is exact in any
  summation order); ``#wrong`` counts the wrong items over all ranks and
  iterations. Before each iteration the output is poisoned (out of place) or the
  input restored (in place), outside the timed region;
- size is the whole vector (all-gather: the gathered vector, reduce-scatter: the
  input), ``algbw = size / time``, ``busbw = algbw · factor`` with nccl-tests'
  factors: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n,
  broadcast 1 (see nccl-tests' doc/PERFORMANCE.md);
- memory: at the largest size, each mpidp algorithm's peak of new allocations
  during one call, measured with tracemalloc (NumPy reports its buffers there):
  on the first call with an empty ScratchPool (the scratch it needs), and in
  steady state after warm-up (pooled scratch is reused: about 0).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import numpy as np
from mpi4py import MPI

from ..collectives import api
from .case import MPI_OPS, Case, make_row, memory, time_rows
from .output import (
    COLLECTIVES,
    TITLES,
    cpu_model,
    format_memory,
    format_row,
    header,
    human,
    parse_size,
    placement,
    plot,
    write_csv,
    write_json,
)
from .peers import describe, gloo_call, start_gloo, stop_gloo

DTYPES = ("float32", "float64", "int32", "int64")
# the persistent forms timed beside the plain calls: rows with "persistent": true
PERSISTENT = ("native persistent", "auto persistent")
FULL_ITERS_UP_TO = 1 << 20  # above this size the iteration counts halve per doubling
MIN_ITERS = 20


def iterations(nbytes: int, iters: int, warmup: int) -> tuple[int, int]:
    """(warm-up, timed) iterations for a size: all of them up to 1 MiB, then fewer."""
    scale = max(1, nbytes // FULL_ITERS_UP_TO)
    return max(1, warmup // scale), max(min(iters, MIN_ITERS), iters // scale)


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mpidp.bench collectives", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min", type=parse_size, default=8, metavar="BYTES", help="default 8")
    p.add_argument("--max", type=parse_size, default=64 << 20, metavar="BYTES",
                   help="default 64MiB")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma-separated subset of {','.join(COLLECTIVES)}")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--op", default="sum", choices=sorted(MPI_OPS))
    p.add_argument("--iters", type=int, default=50,
                   help="timed iterations up to 1 MiB, halved per doubling above (min 20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up iterations (scaled alike)")
    p.add_argument("--inplace", default="both", choices=["off", "on", "both"],
                   help="out of place, in place, or both (broadcast has one buffer)")
    p.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    p.add_argument("--no-persistent", action="store_true",
                   help="skip the persistent forms (native *_init and mpidp's)")
    p.add_argument("--no-gloo", action="store_true",
                   help="skip torch.distributed's gloo rows even where PyTorch is installed")
    p.add_argument("--json", metavar="FILE", help="write metadata and rows as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="busbw and latency against size")
    args = p.parse_args(argv)
    args.collectives = [c for c in args.collectives.split(",") if c]
    for c in args.collectives:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c!r}; expected some of {COLLECTIVES}")
    if not 0 < args.min <= args.max:
        p.error("need 0 < --min <= --max")
    if args.iters < 1 or args.warmup < 0:
        p.error("need --iters >= 1 and --warmup >= 0")
    return args


# ------------------------------------------------------------------ the sweep

def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def count_for(collective: str, nbytes: int, itemsize: int, n: int) -> int:
    """Items of the whole vector; reduce-scatter and all-gather round down to N blocks."""
    count = nbytes // itemsize
    if collective in ("reduce_scatter", "allgather"):
        count -= count % n
    return count


def make_buffers(args, n: int, rank: int) -> dict:
    """Input, output and expected answer at the largest size; every row uses views of them."""
    dtype = np.dtype(args.dtype)
    items = args.max // dtype.itemsize
    i = np.arange(items, dtype=np.int64)
    if args.op == "prod":
        vals = np.where((i + rank) % 5 == 0, -1, 1)  # ±1: no overflow, exact
    else:
        vals = (i * 7 + rank * 13) % 61 - 30  # small integers: exact sums in any order
    return {"x": vals.astype(dtype), "out": np.empty(items, dtype), "want": np.empty(items, dtype),
            "poison": -12345}


def sweep(comm, args, log, natives: dict | None = None) -> list[dict]:
    """Every collective, placement and size: native, mpidp's algorithms, the persistent forms.

    With ``natives`` ({(collective, inplace, bytes): native µs} of a sweep done
    before), the gloo pass instead: gloo alone at every size, its speed-up
    against those native times. Apart, because interleaved with the others
    gloo's calls slowed them (docs/benchmarks-notes.md).
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    dtype = np.dtype(args.dtype)
    bufs = make_buffers(args, n, rank)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.inplace]
    rows = []
    for collective in args.collectives:
        algorithms = api.ALGORITHMS[collective]  # read now: the list grows with mpidp
        for inplace in ([None] if collective == "bcast" else modes):
            place = placement(inplace)
            log(f"\n# {'gloo: ' if natives else ''}{TITLES[collective]}, {place}, {n} ranks, "
                f"{dtype}"
                + ("" if collective in ("allgather", "bcast") else f", op {args.op}"))
            log(header())
            largest = [s for s in sizes(args.min, args.max)
                       if count_for(collective, s, dtype.itemsize, n) > 0][-1:]
            for nbytes in sizes(args.min, args.max):
                count = count_for(collective, nbytes, dtype.itemsize, n)
                if count == 0:
                    continue  # fewer items than ranks
                case = Case(comm, collective, count, inplace, args.op, bufs)
                case.setup()
                warmup, iters = iterations(nbytes, args.iters, args.warmup)
                native_us = (natives.get((collective, inplace, count * dtype.itemsize))
                             if natives else None)  # a row's bytes: whole blocks
                calls = {"gloo": gloo_call(case)} if natives else {"native": case.native()}
                if not natives:
                    calls.update((algorithm, case.mpidp(algorithm)) for algorithm in algorithms)
                frees = []
                if not args.no_persistent and not natives:  # planned once, started each time
                    for name in PERSISTENT:
                        calls[name], free = case.persistent(native=name.startswith("native"))
                        frees.append(free)
                measured = time_rows(case, calls, warmup, iters)
                for free in frees:
                    free()
                for name in calls:
                    algorithm, persistent = name.split()[0], name in PERSISTENT
                    resolved = None if algorithm in ("native", "gloo") else api.choose(
                        comm, collective, count * dtype.itemsize, algorithm)
                    times, wrong = measured[name]
                    row = make_row(collective, algorithm, resolved, inplace, count, dtype,
                                   n, times, wrong, warmup, persistent)
                    if algorithm == "native":
                        native_us = row["time_us"]
                    if algorithm == "gloo":
                        row["implementation"] = args.gloo
                    row["speedup"] = (native_us / row["time_us"] if native_us and row["time_us"] > 0
                                      else None)
                    if (nbytes in largest and algorithm not in ("native", "gloo") and not persistent
                            and not args.no_memory):
                        row.update(memory(case, algorithm))
                    rows.append(row)
                    log(format_row(row))
    return rows


# ------------------------------------------------------------------ metadata


def library() -> str:
    """The MPI library's version text (Open MPI's ends in a NUL byte)."""
    return MPI.Get_library_version().replace("\x00", "").strip()


def metadata(comm, args) -> dict:
    import mpi4py

    return {
        "benchmark": "mpidp.bench collectives",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "mpi_library": library(),
        "mpi_library_short": " ".join(library().split()[:3]).rstrip(","),
        "mpi4py": mpi4py.__version__, "numpy": np.__version__,
        "ranks": comm.Get_size(), "dtype": args.dtype, "op": args.op,
        "min_bytes": args.min, "max_bytes": args.max, "iters": args.iters,
        "warmup": args.warmup, "full_iters_up_to": FULL_ITERS_UP_TO, "min_iters": MIN_ITERS,
        "inplace": args.inplace, "algorithms": {c: list(api.ALGORITHMS[c])
                                                for c in args.collectives},
        "argv": sys.argv,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    comm = MPI.COMM_WORLD.Dup()  # our own context: no message of ours meets a user's
    rank, n = comm.Get_rank(), comm.Get_size()
    log = print if rank == 0 else (lambda *a, **k: None)
    meta = metadata(comm, args)
    meta["gloo"] = "off (--no-gloo)" if args.no_gloo else describe()
    args.gloo = meta["gloo"] if meta["gloo"].startswith("torch") else None
    log(f"# mpidp collectives benchmark: {n} ranks, {args.dtype}, op {args.op}, "
        f"{human(args.min)} .. {human(args.max)}")
    log(f"# {meta['mpi_library_short']}; mpi4py {meta['mpi4py']}, numpy {meta['numpy']}; "
        f"{meta['cpu']}, {meta['cores']} cores")
    log(f"# iterations: {args.warmup} warm-up + {args.iters} timed per size up to "
        f"{human(FULL_ITERS_UP_TO)}, halved per doubling above (at least 1 + "
        f"{min(args.iters, MIN_ITERS)}); each iteration runs every algorithm once, "
        "in turn, the order rotating by one per iteration, a barrier before each call")
    log("# time: slowest rank per iteration, median (and min) over iterations; "
        "busbw = algbw x (all-reduce 2(n-1)/n, reduce-scatter/all-gather (n-1)/n, bcast 1)")
    log(f"# gloo: {meta['gloo']}")
    log("# vs native: native time / this time (>1: faster than the MPI library); "
        "#wrong: items differing from the native result, all ranks and iterations")
    try:
        rows = sweep(comm, args, log)
        if args.gloo:  # only now: not even imported while the others are timed
            start_gloo(comm)
            rows += sweep(comm, args, log, {(r["collective"], r["inplace"], r["bytes"]):
                                            r["time_us"] for r in rows
                                            if r["algorithm"] == "native" and not r["persistent"]})
    finally:
        if args.gloo:
            stop_gloo()
        comm.Free()
    for line in format_memory(rows):
        log(line)
    wrong = sum(r["wrong"] for r in rows)
    log(f"\n# {len(rows)} rows, {wrong} wrong items" + ("" if wrong == 0 else "  <-- ERRORS"))
    if rank == 0:
        if args.json:
            write_json(args.json, meta, rows)
        if args.csv:
            write_csv(args.csv, rows)
        if args.plot:
            plot(rows, meta, args.plot)
    return 1 if wrong else 0
