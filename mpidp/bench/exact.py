"""What EXACT_SUM costs against plain SUM: ``mpiexec -n 2 python -m mpidp.bench exact``.

For each size and dtype, interleaved in one run (so that load on a shared machine
falls on both alike), each repeat times one call of every variant:

    sum      mpidp.allreduce(op=SUM), the algorithm `auto` picks
    exact    mpidp.allreduce(op=EXACT_SUM): N addends; on 2 ranks that is one
             addition (a + b == b + a), plain SUM and a NaN check
    grid     mpidp.allreduce_parts with N + 1 addends (rank 0 holds two): the
             pre-rounded sum every N >= 3 takes, here its direct path (each
             block's addends to its owner, summed there, all-gathered)
    words    the same call on the words path (the MAX pass, the words, back),
             the direct path turned off for it: the A/B of the two exchanges
    native   the MPI library's Allreduce (MPI.SUM), for scale

and prints the medians over `--repeats` calls, and the ratios to `sum`, with the
load average beside them.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import mpidp
from mpidp.collectives import cost, exact_direct

from .output import HelpFormatter, parse_size


def _time(comm, fn) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def _on_words(comm, extra, y) -> None:
    """grid's call with the direct path off (every rank alike): the words path."""
    before, exact_direct.MOST_PER_RANK = exact_direct.MOST_PER_RANK, 0
    try:
        mpidp.allreduce_parts(comm, extra, y, addends=comm.Get_size() + 1)
    finally:
        exact_direct.MOST_PER_RANK = before


def _variants(comm, x, y, extra) -> dict:
    N = comm.Get_size()
    return {
        "sum": lambda: mpidp.allreduce(comm, x, y),
        "exact": lambda: mpidp.allreduce(comm, x, y, op=mpidp.EXACT_SUM),
        "grid": lambda: mpidp.allreduce_parts(comm, extra, y, addends=N + 1),
        "words": lambda: _on_words(comm, extra, y),
        "native": lambda: comm.Allreduce(x, y, op=MPI.SUM),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpidp.bench exact", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB", help="buffer sizes, comma-separated")
    p.add_argument("--dtypes", default="float64,float32", help="dtypes, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="timed calls of each variant")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    cost.set_model(comm, *cost.DEFAULT)  # the same `auto` choices on every run
    rows = []
    for dtype in args.dtypes.split(","):
        for size in (parse_size(s) for s in args.sizes.split(",")):
            count = size // np.dtype(dtype).itemsize
            rng = np.random.default_rng(rank)
            x = rng.standard_normal(count).astype(dtype)
            extra = [x, rng.standard_normal(count).astype(dtype)] if rank == 0 else [x]
            y = np.empty_like(x)
            variants = _variants(comm, x, y, extra)
            for fn in variants.values():  # warm up: pools, setups
                fn()
            times = {k: [] for k in variants}
            for _ in range(args.repeats):
                for k, fn in variants.items():
                    times[k].append(_time(comm, fn))
            med = {k: float(np.median(v)) for k, v in times.items()}
            rows.append((dtype, size, med))
            if rank == 0:
                load = os.getloadavg()[0]
                print(f"{dtype:8s} {size >> 20:3d} MiB  " + "  ".join(
                    f"{k} {med[k] * 1e3:7.1f} ms" for k in variants) +
                      f"  | exact/sum {med['exact'] / med['sum']:.2f}x  grid/sum "
                      f"{med['grid'] / med['sum']:.2f}x  words/sum "
                      f"{med['words'] / med['sum']:.2f}x  (load {load:.1f})", flush=True)
    return 0
