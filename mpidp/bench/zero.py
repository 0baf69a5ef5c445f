"""``python -m mpidp.bench zero``: memory per rank under ZeRO stages 0-3, measured.

    for n in 1 2 3 4 5 6 7 8; do
        mpiexec -n $n python -m mpidp.bench zero --json docs/bench/zero-n$n.json
    done
    python -m mpidp.bench zero --report docs/bench --doc docs/zero.md    # no mpiexec

One run builds the demo model (``make demo``'s MLP 64-128-64-10, float32) under
each stage (0-3) and optimizer (SGD with momentum, Adam), one bucket per
layer, and trains a few steps on random data. Per rank it records the model
states held between steps (parameters, gradients, optimizer state, counted from
the arrays: `training.memory`), the formula's figure, and the peak of the last
step: those states plus tracemalloc's peak of what the step allocates. A row
holds the largest rank's figures (shards differ by one item at most).

``--timing`` also times steps of a larger model (``--hidden``, blocks of steps taking
turns, `ROUNDS` times) under stage 0,
stage 2 with the parameters' all-gather completed in ``step()`` or left to
overlap the next forward (``prefetch=True``), and stage 3 without and with
prefetch (the next unit's all-gather in flight while one computes): the slowest
rank's median step, and its exposed communication (the step's time outside the
model's own forward and backward arithmetic is not separable here: the figure is
``backward``'s wait for the buckets, `DataParallel.timings`).
``--report`` reads every ``zero-n*.json`` of a folder and writes the tables into
the document, between ``<!-- zero-table -->`` and ``<!-- /zero-table -->``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import time

import numpy as np
from mpi4py import MPI

from .. import collectives as mp
from .. import files
from ..training import MLP, SGD, Adam, DataParallel, softmax_cross_entropy
from ..training.memory import StepPeak, formula_bytes, model_state_bytes
from ..training.trainer import blas_threads
from .output import HelpFormatter, publish, read_json

DEMO = [64, 128, 64, 10]
KINDS = {"sgd": (lambda m: SGD(m.params, m.grads, lr=0.05, momentum=0.9), 1),
         "adam": (lambda m: Adam(m.params, m.grads), 2)}
MARK = ("<!-- zero-table -->", "<!-- /zero-table -->")


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mpidp.bench zero", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="local batch per rank")
    p.add_argument("--steps", type=int, default=3, help="training steps per stage")
    p.add_argument("--timing", action="store_true", help="also time prefetch on and off")
    p.add_argument("--hidden", default="1024,1024,1024", help="the timed model's hidden widths")
    p.add_argument("--timed-steps", type=int, default=20, help="with --timing: timed steps")
    p.add_argument("--json", metavar="FILE", help="write the rows here (rank 0)")
    p.add_argument("--report", metavar="DIR", help="tables from DIR/zero-n*.json (no MPI run)")
    p.add_argument("--doc", metavar="FILE.md", help="with --report: write the tables here")
    return p.parse_args(argv)


def batch(comm, sizes, b: int, dtype="float32"):
    rng = np.random.default_rng(comm.Get_rank())
    return rng.standard_normal((b, sizes[0])).astype(dtype), rng.integers(0, sizes[-1], b)


def measure(comm, zero: int, kind: str, args) -> dict:
    """Model states between steps and the last step's peak on this rank, largest rank's kept."""
    model = MLP(DEMO, dtype="float32", seed=0)
    P = model.num_params()  # before stage 3 leaves only the shard
    units = [(i + 1) * o for i, o in zip(DEMO[:-1], DEMO[1:], strict=True)]  # W_i and b_i
    make, copies = KINDS[kind]
    x, y = batch(comm, DEMO, args.batch)
    with DataParallel(model, comm, bucket_mb=0, zero=zero, optimizer=make(model)) as ddp:
        for _ in range(args.steps):
            held = model_state_bytes(ddp)["total"]  # what the step starts from
            with StepPeak() as peak:
                ddp.backward(softmax_cross_entropy(ddp.forward(x), y)[1])
                ddp.step()
        states = model_state_bytes(ddp)
        mine = np.array([states["total"], formula_bytes(zero, P, 4, copies, comm.Get_size(),
                                                         comm.Get_rank(), units),
                         held + peak.bytes, states["params"], states["grads"],
                         states["optimizer"]], dtype=np.int64)
        mp.allreduce(ddp.comm, mp.IN_PLACE, mine, op="max")
    keys = ("states", "formula", "peak", "params_bytes", "grads_bytes", "optimizer_bytes")
    return {"ranks": comm.Get_size(), "zero": zero, "optimizer": kind, "K": copies,
            "P": P, **dict(zip(keys, (int(v) for v in mine), strict=True))}


ROUNDS = 3  # --timing: the configurations take turns this many times


def timing(comm, args) -> list[dict]:
    """Median step (the slowest rank's) of Adam at stage 0, 2 and 3, without and with prefetch.

    The five take turns, a block of steps each, `ROUNDS` times (a load that comes and goes
    hits all alike); not step by step, since stage 2's prefetched all-gather runs on into
    the next step, which another configuration's messages must not share."""
    sizes = [256, *[int(h) for h in args.hidden.split(",") if h], 10]
    x, y = batch(comm, sizes, args.batch)
    configs = ((0, False), (2, False), (2, True), (3, False), (3, True))
    ddps = []
    for zero, prefetch in configs:
        model = MLP(sizes, dtype="float32", seed=0)
        extra = {"prefetch": prefetch} if zero else {}
        ddps.append(DataParallel(model, comm, bucket_mb=0, zero=zero,
                                 optimizer=Adam(model.params, model.grads), **extra))
    times = [[] for _ in configs]
    exposed = [[] for _ in configs]
    per_round = -(-args.timed_steps // ROUNDS)
    try:
        for _ in range(ROUNDS):
            for ddp, t, e in zip(ddps, times, exposed, strict=True):
                for i in range(1 + per_round):  # the first of each block not kept
                    comm.Barrier()
                    t0 = time.perf_counter()
                    ddp.backward(softmax_cross_entropy(ddp.forward(x), y)[1])
                    ddp.step()
                    if i:
                        t.append(time.perf_counter() - t0)
                        e.append(ddp.timings["exposed_comm"])
                if ddp.zero:
                    ddp.wait_params()  # the block's last all-gather, before the next's messages
    finally:
        for ddp in ddps:
            ddp.close()
    rows = []
    for (zero, prefetch), t, e in zip(configs, times, exposed, strict=True):
        steps = np.array([t, e])
        mp.allreduce(comm, mp.IN_PLACE, steps, op="max")
        rows.append({"ranks": comm.Get_size(), "sizes": sizes, "zero": zero,
                     "prefetch": prefetch, "step_ms": 1e3 * float(np.median(steps[0])),
                     "exposed_ms": 1e3 * float(np.median(steps[1])),
                     "load": os.getloadavg()[0], "cpus": os.cpu_count()})
    return rows


def run(args) -> int:
    comm = MPI.COMM_WORLD
    with blas_threads(1):
        rows = [measure(comm, zero, kind, args) for kind in KINDS for zero in (0, 1, 2, 3)]
        timed = timing(comm, args) if args.timing else []
    if comm.Get_rank() == 0:
        for r in rows:
            print(f"N={r['ranks']} zero={r['zero']} {r['optimizer']:4s} states {r['states']:8d} B"
                  f" (formula {r['formula']:8d}) peak {r['peak']:8d} B")
        for t in timed:
            print(f"N={t['ranks']} {t['sizes']} zero={t['zero']} prefetch={t['prefetch']}: "
                  f"{t['step_ms']:.2f} ms/step")
        if args.json:
            files.write_json(args.json, {"rows": rows, "timing": timed}, indent=1)
    return 0


def tables(runs: list[dict]) -> list[str]:
    """The memory table (one row per N and optimizer) and, if measured, the timing table."""
    rows = sorted((r for run in runs for r in run["rows"]),
                  key=lambda r: (r["ranks"], r["optimizer"] != "sgd", r["zero"]))
    by = {(r["ranks"], r["optimizer"], r["zero"]): r for r in rows}
    first = rows[0]
    out = [f"Demo model MLP {DEMO}, P = {first['P']} parameters, float32 "
           f"(P = {4 * first['P']} bytes).",
           "Model states per rank in bytes, the largest rank's; every figure measured equals",
           "its formula unless marked ✗. Peak: the model states plus what the step allocates",
           "(tracemalloc).", "",
           "| N | optimizer | K | stage 0 | stage 1 | stage 2 | stage 3 | stage 1 / 0 "
           "| stage 2 / 0 | stage 3 / 0 | peak 0 | peak 1 | peak 2 | peak 3 |", "|" + "---|" * 14]
    for n, kind in sorted({(r["ranks"], r["optimizer"]) for r in rows},
                          key=lambda k: (k[0], k[1] != "sgd")):
        s = [by.get((n, kind, z)) for z in (0, 1, 2, 3)]
        if None in s:
            continue
        cell = [f"{r['states']}" + ("" if r["states"] == r["formula"] else " ✗") for r in s]
        name = "SGD momentum" if kind == "sgd" else "Adam"
        ratios = " | ".join(f"{r['states'] / s[0]['states']:.2%}" for r in s[1:])
        out.append(f"| {n} | {name} | {s[0]['K']} | {' | '.join(cell)} | {ratios}"
                   f" | {' | '.join(str(r['peak']) for r in s)} |")
    timed = [t for run in runs for t in run.get("timing", [])]
    if timed:
        out += ["", f"Step time, Adam, MLP {timed[0]['sizes']} float32, one bucket per layer",
                "(the slowest rank's median; the machine's 1-minute load average as the run",
                "ended, and its CPU count):", "",
                "| N | stage 0 | stage 2 | stage 2, prefetch | prefetch / no prefetch "
                "| stage 3 | stage 3, prefetch | prefetch / no prefetch | load | CPUs |",
                "|" + "---|" * 10]
        for n in sorted({t["ranks"] for t in timed}):
            ts = [t for t in timed if t["ranks"] == n]
            ms = {(t["zero"], t["prefetch"]): t["step_ms"] for t in ts}
            three = (f"{ms[3, False]:.1f} ms | {ms[3, True]:.1f} ms | "
                     f"{ms[3, True] / ms[3, False]:.2f}") if (3, True) in ms else "- | - | -"
            out.append(f"| {n} | {ms[0, False]:.1f} ms | {ms[2, False]:.1f} ms | "
                       f"{ms[2, True]:.1f} ms | {ms[2, True] / ms[2, False]:.2f} | {three} | "
                       f"{ts[-1].get('load', float('nan')):.1f} | {ts[-1].get('cpus', '')} |")
    return out


def report(args) -> int:
    paths = sorted(glob.glob(os.path.join(args.report, "zero-n*.json")),
                   key=lambda p: int(re.search(r"n(\d+)", os.path.basename(p)).group(1)))
    if not paths:
        raise SystemExit(f"no zero-n*.json in {args.report}")
    runs = [read_json(p) for p in paths]
    return publish(tables(runs), args.doc, MARK)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    return report(args) if args.report else run(args)
