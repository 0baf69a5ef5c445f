"""``python -m mpidp.bench overlap``: how much of the gradient all-reduce backward hides.

    mpiexec -n 4 python -m mpidp.bench overlap [--hidden 512,512,512] [--batch 64]

One run times the same training step (same model, same local batch) several ways,
the modes taking turns step by step (a load that comes and goes hits all alike):

    compute         forward + backward + SGD, no communication at all       (a)
    compute+blocks  (a), backward cut in the row blocks of the pieces modes
    serial          backward, then one all-reduce per bucket (overlap=False) (b)
    overlap         each bucket launched as backward writes it, polled
                    between layers, no thread                                (c)
    overlap+thread  (c) + the polling thread (test all, sleep 100 µs)
    overlap+wait    (c) + the thread that blocks in MPI on the oldest round
    overlap+blocks  (c), each layer's backward in row blocks, polled between
    overlap+pieces  (c), each row block's gradient reduced as it is written
    pieces+wait     overlap+pieces + the blocking thread
    default         DataParallel's defaults (what the trainer runs)

and prints the median step time (the slowest rank's, each step starting at a
barrier), the exposed communication (the wait after backward of the rank that
finished backward last), the CPU time a step took (the busiest rank's: user and
system time of all its threads; and the system time alone, the kernel's work, a
rank's mean), the hidden fraction
((b) - (c)) / ((b) - (a)), the efficiency ((b) - (c)) / min(exposed comm of (b),
backward of (a)) (`efficiency`), and, for
the overlapped modes, each bucket's launch and completion time relative to the
start of backward.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
from mpi4py import MPI

from .. import files
from ..collectives import api
from ..training import MLP, SGD, DataParallel, softmax_cross_entropy
from ..training.pieces import RowsOnly
from ..training.trainer import blas_threads
from .output import HelpFormatter
from .overlap_show import plot, report, write_csv  # noqa: F401 (plot: overlap.plot)

MODES = ("compute", "compute+blocks", "serial", "overlap", "overlap+thread", "overlap+wait",
         "overlap+blocks", "overlap+pieces", "pieces+wait", "default")
BASELINES = ("compute", "compute+blocks", "serial")  # nothing overlapped: no efficiency
DEFAULT_MODES = ("compute", "serial", "overlap", "overlap+thread", "default")


def settings(mode: str, args) -> dict | None:
    """DataParallel's keywords for a mode (None: compute only)."""
    piece = args.piece_mb if args.piece_mb == "auto" else float(args.piece_mb)
    common = {"bucket_mb": args.bucket_mb, "first_bucket_mb": args.first_bucket_mb,
              "algorithm": args.algorithm}
    if mode == "default":
        return common
    common.update(progress_thread=False, piece_mb=None)
    return {"compute": None,
            "compute+blocks": {**common, "piece_mb": RowsOnly(piece)},
            "serial": {**common, "overlap": False},
            "overlap": common,
            "overlap+thread": {**common, "progress_thread": "poll"},
            "overlap+wait": {**common, "progress_thread": "wait"},
            "overlap+blocks": {**common, "piece_mb": RowsOnly(piece)},
            "overlap+pieces": {**common, "piece_mb": piece},
            "pieces+wait": {**common, "piece_mb": piece, "progress_thread": "wait"}}[mode]


def efficiency(serial: dict, compute: dict, mode: dict) -> float:
    """hidden / hideable: hidden = serial step - this mode's step; hideable = the serial
    mode's exposed communication, or compute-only backward if shorter (communication
    can hide behind backward only). Medians in ms; nan when nothing is hideable."""
    hideable = min(serial["exposed_comm_ms"], compute["backward_ms"])
    if not hideable > 0:
        return float("nan")
    return (serial["step_ms"] - mode["step_ms"]) / hideable


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mpidp.bench overlap", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--hidden", default="512,512,512", help="the MLP's hidden widths")
    p.add_argument("--features", type=int, default=256, help="input features")
    p.add_argument("--classes", type=int, default=10, help="output classes")
    p.add_argument("--batch", type=int, default=64, help="local batch per rank")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="parameters and gradients")
    p.add_argument("--bucket-mb", type=float, default=0.0, help="0: one bucket per layer")
    p.add_argument("--first-bucket-mb", type=float, default=1.0,
                   help="the first bucket's size (the last layers' gradients)")
    p.add_argument("--algorithm", default="auto", choices=api.ALGORITHMS["allreduce"],
                   help="the buckets' all-reduce")
    p.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated, of {', '.join(MODES)} (all: every one)")
    p.add_argument("--piece-mb", default="auto",
                   help="the pieces' size in MiB for the blocks/pieces modes (auto: the "
                        "cost model's)")
    p.add_argument("--json", metavar="FILE", help="also write the figures here (rank 0)")
    p.add_argument("--csv", metavar="FILE", help="one row per mode (rank 0)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="step time per mode, and each bucket's launch..complete span (rank 0)")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="BLAS threads per rank (1: ranks share the node's cores fairly)")
    return p.parse_args(argv)


def _system() -> float:
    """This process's system time so far, s: the kernel's work for it (TCP's among it).
    Linux splits the process's run time between user and system by tick samples, so
    a step's figure is coarse: the benchmark reports the mean over steps and ranks."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


class Mode:
    """One mode's model, optimizer and DataParallel, and its per-step times on this rank."""

    def __init__(self, mode: str, comm, args, sizes):
        self.model = MLP(sizes, dtype=args.dtype, seed=0)
        self.opt = SGD(self.model.params, self.model.grads, lr=1e-3, momentum=0.9)
        kw = settings(mode, args)
        self.ddp = None if kw is None else DataParallel(self.model, comm, **kw)
        self.blocks = None  # compute+blocks: backward cut as the pieces modes cut it, alone
        if mode == "compute+blocks":
            self.blocks = self.ddp.row_stops
            self.ddp.close()
            self.ddp = None
        self.out = {"step": [], "cpu": [], "sys": [], "backward": [], "exposed": [], "buckets": []}

    def step(self, comm, x, y, record: bool) -> None:
        model, ddp = self.model, self.ddp
        comm.Barrier()
        t0, cpu0, sys0 = time.perf_counter(), time.process_time(), _system()
        logits = model.forward(x) if ddp is None else ddp.forward(x)  # (b, C)
        _, dlogits = softmax_cross_entropy(logits, y)
        if ddp is None:
            t_backward = time.perf_counter()  # backward alone, as ddp.timings measures it
            model.backward(dlogits, row_stops=self.blocks)
            backward, exposed = time.perf_counter() - t_backward, 0.0
        else:
            ddp.backward(dlogits)
            backward, exposed = ddp.timings["backward"], ddp.timings["exposed_comm"]
        self.opt.step()
        if record:
            out = self.out
            out["step"].append(time.perf_counter() - t0)
            out["cpu"].append(time.process_time() - cpu0)
            out["sys"].append(_system() - sys0)
            out["backward"].append(backward)
            out["exposed"].append(exposed)
            if ddp is not None:
                out["buckets"].append(ddp.bucket_times())

    def close(self) -> dict:
        if self.ddp is not None:
            self.out["layout"] = [(b.units, int(b.flat.nbytes)) for b in self.ddp.buckets]
            thread = self.ddp.thread
            self.out["design"] = {"progress_thread": thread and thread.kind,  # as resolved
                                  "pieces": sum(map(len, self.ddp.reducer.pieces.values())),
                                  "blocks": self.ddp.row_stops is not None}
            self.ddp.close()
        return self.out


def run_modes(modes: list[str], comm, args, sizes, x, y) -> dict:
    """Every mode's steps, taking turns: step k of each mode, then step k+1."""
    runs = {mode: Mode(mode, comm, args, sizes) for mode in modes}
    for i in range(args.warmup + args.steps):
        for run in runs.values():
            run.step(comm, x, y, record=i >= args.warmup)
    return {mode: run.close() for mode, run in runs.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    sizes = [args.features, *[int(h) for h in args.hidden.split(",") if h], args.classes]
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((args.batch, args.features)).astype(args.dtype)  # (b, D)
    y = rng.integers(0, args.classes, args.batch)  # (b,)
    modes = list(MODES) if args.modes == "all" else args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    with blas_threads(args.blas_threads):
        results = run_modes(modes, comm, args, sizes, x, y)
    summary = {"ranks": size, "sizes": sizes, "batch": args.batch, "dtype": args.dtype,
               "bucket_mb": args.bucket_mb, "algorithm": args.algorithm,
               "piece_mb": args.piece_mb, "steps": args.steps,
               "async_progress": os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0"),
               "load_average": list(os.getloadavg()), "modes": {}}
    for mode, r in results.items():
        slowest, last, cpu = np.array(r["step"]), np.array(r["exposed"]), np.array(r["cpu"])
        api.allreduce(comm, api.IN_PLACE, slowest, op="max")  # a step lasts as its slowest rank
        # the wait of the rank that finished backward last: the communication's own time
        # (an earlier rank's wait also holds its lateness, which no overlap can hide)
        api.allreduce(comm, api.IN_PLACE, last, op="min")
        api.allreduce(comm, api.IN_PLACE, cpu, op="max")
        system = np.array(r["sys"])
        api.allreduce(comm, api.IN_PLACE, system, op="sum")
        entry = {"step_ms": 1e3 * float(np.median(slowest)),
                 "backward_ms": 1e3 * float(np.median(r["backward"])),
                 "exposed_comm_ms": 1e3 * float(np.median(last)),
                 "exposed_comm_rank0_ms": 1e3 * float(np.median(r["exposed"])),
                 "cpu_ms": 1e3 * float(np.median(cpu)),
                 "sys_ms": 1e3 * float(np.mean(system)) / size}  # a rank's, on average
        if "design" in r:
            entry["design"] = r["design"]
        if r["buckets"]:
            entry["buckets"] = [
                {"bucket": k, "layers": layers, "mb": nbytes / 2**20,
                 "launch_ms": 1e3 * float(np.median([s[k]["launch"] for s in r["buckets"]])),
                 "complete_ms": 1e3 * float(np.median([s[k]["complete"] for s in r["buckets"]]))}
                for k, (layers, nbytes) in enumerate(r["layout"])]
            for k, b in enumerate(entry["buckets"]):
                if "pieces" in r["buckets"][0][k]:
                    b["pieces_ms"] = [[1e3 * float(np.median([s[k]["pieces"][j][e]
                                                              for s in r["buckets"]]))
                                       for e in (0, 1)]
                                      for j in range(len(r["buckets"][0][k]["pieces"]))]
        summary["modes"][mode] = entry
    m = summary["modes"]
    if {"compute", "serial"} <= m.keys():
        comm_cost = m["serial"]["step_ms"] - m["compute"]["step_ms"]
        for mode in m:
            if mode not in BASELINES:
                m[mode]["hidden_fraction"] = ((m["serial"]["step_ms"] - m[mode]["step_ms"])
                                              / comm_cost if comm_cost > 0 else float("nan"))
                m[mode]["hidden_ms"] = m["serial"]["step_ms"] - m[mode]["step_ms"]
                m[mode]["efficiency"] = efficiency(m["serial"], m["compute"], m[mode])
    if rank == 0:
        report(summary)
        if args.json:
            files.write_json(args.json, summary, indent=1)
        if args.csv:
            write_csv(summary, args.csv)
        if args.plot:
            plot(summary, args.plot)
    return 0
