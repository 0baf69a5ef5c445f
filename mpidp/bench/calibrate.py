"""``python -m mpidp.bench calibrate [--max BYTES] [--reps R]``, under ``mpiexec -n N``.

Calibrates the α-β-γ model on COMM_WORLD, prints it, then for message sizes
8 B, 64 B, 512 B, ... up to --max (default 16 MiB) prints, for each all-reduce
algorithm, the measured median time beside the model's prediction, the native
``MPI_Allreduce``, which algorithm ``auto`` picks, and how ``auto`` does against
the best fixed algorithm and against native. Times are the slowest rank's, in
microseconds; the table is Markdown.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from mpidp.bench.output import HelpFormatter, human, parse_size
from mpidp.collectives import ALGORITHMS, api, cost


def _reps(nbytes: int, reps: int | None) -> int:
    if reps:
        return reps
    for limit, count in ((32 << 10, 60), (256 << 10, 20), (2 << 20, 8)):
        if nbytes <= limit:
            return count
    return 5


def rate(seconds_per_byte: float) -> str:
    """A per-byte cost as a bandwidth ("no cost found" where the fit set it to 0)."""
    return f"{1e-9 / seconds_per_byte:.2f} GB/s" if seconds_per_byte > 0 else "no cost found"


def measure(comm, nbytes: int, names, reps: int) -> dict[str, float]:
    """Median seconds (slowest rank's) of each algorithm and of native, interleaved rep by rep."""
    x = np.ones(max(nbytes // 4, 1), np.float32)
    y = np.empty_like(x)
    calls = {name: (lambda a=name: api.allreduce(comm, x, y, algorithm=a)) for name in names}
    calls["native"] = lambda: comm.Allreduce(x, y)
    for call in calls.values():  # warm up: scratch buffers, connections
        call()
    times = np.empty((reps, len(calls)))
    for rep in range(reps):
        for j, call in enumerate(calls.values()):
            comm.Barrier()
            t0 = time.perf_counter()
            call()
            times[rep, j] = time.perf_counter() - t0
    slowest = np.empty_like(times)
    comm.Allreduce(times, slowest, MPI.MAX)
    return dict(zip(calls, np.median(slowest, axis=0), strict=True))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidp.bench calibrate", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--max", type=parse_size, default="16MiB", help="largest size")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed calls per size (unset: fewer as sizes grow)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()

    start = time.perf_counter()
    model = cost.calibrate(comm)
    took = time.perf_counter() - start
    cost.set_model(comm, *model)
    fixed = ALGORITHMS["allreduce"][:-1]
    if rank == 0:
        print(f"# mpidp calibrate: {n} ranks, float32 all-reduce, times in µs (slowest rank, "
              f"median), model prediction in brackets")
        print(f"# fixed = {model.fixed * 1e6:.2f} µs/call, "
              f"alpha = {model.alpha * 1e6:.2f} µs/round, "
              f"beta = {model.beta * 1e9:.4f} ns/B ({rate(model.beta)}), "
              f"gamma = {model.gamma * 1e9:.4f} ns/B ({rate(model.gamma)}); "
              f"calibration took {took * 1e3:.0f} ms\n")
        print("| size | " + " | ".join(fixed) + " | native | auto picks | auto | "
              "auto / best | auto / native |")
        print("|---:|" + "---:|" * len(fixed) + "---:|:---|---:|---:|---:|")
    sizes, nbytes = [], 8
    while nbytes < args.max:
        sizes.append(nbytes)
        nbytes *= 8
    sizes.append(args.max)
    for nbytes in sizes:
        nbytes = max(nbytes // 4, 1) * 4  # whole float32 items
        t = measure(comm, nbytes, (*fixed, "auto"), _reps(nbytes, args.reps))
        if rank == 0:
            pick = api.choose(comm, "allreduce", nbytes, "auto")
            predicted = {a: cost.predict(model, "allreduce", a, nbytes, n) for a in fixed}
            cells = [f"{t[a] * 1e6:.0f} ({predicted[a] * 1e6:.0f})" for a in fixed]
            best = min(t[a] for a in fixed)
            print(f"| {human(nbytes)} | " + " | ".join(cells) + f" | {t['native'] * 1e6:.0f} | "
                  f"{pick} | {t['auto'] * 1e6:.0f} | {t['auto'] / best:.2f} | "
                  f"{t['auto'] / t['native']:.2f} |", flush=True)
    return 0
