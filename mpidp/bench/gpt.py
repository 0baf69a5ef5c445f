"""``python -m mpidp.bench gpt``: the GPT's step, serial and overlapped, its buckets and memory.

    mpiexec -n 2 python -m mpidp.bench gpt --json docs/bench/gpt/n2.json
    python -m mpidp.cluster run --hosts 2 --rate 1gbit -- python -m mpidp.bench gpt --json F
    python -m mpidp.bench gpt --report docs/bench/gpt --doc docs/gpt.md      # no mpiexec

One run builds `make gpt`'s model (examples/train_gpt.py's defaults: 2 blocks,
4 heads, 64 wide, context 64, the stdlib corpus's byte vocabulary; float32,
AdamW) and times the same training step on the same local batch three ways, as
the overlap benchmark does, the three interleaved step by step:

    compute    forward + backward + AdamW, no communication            (a)
    serial     backward, then each bucket's all-reduce (overlap=False)  (b)
    overlap    each bucket launched as backward completes it            (c)

Per mode: the slowest rank's median step, the median backward and exposed
communication, and tokens/s = ranks x local batch x context / step. Then
hidden = (b) - (c), hidden fraction = hidden / ((b) - (a)), and efficiency =
hidden / hideable, hideable = min(serial's exposed communication, compute's
backward): what overlap could hide at best (as `bench overlap` defines it). ``--memory``
adds the model states per rank under ZeRO stages 0, 1, 2 after one step
(`training.memory`, measured from the arrays, beside the formula), ``--trace``
a Chrome trace of one overlapped step (after the warm-up steps).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np
from mpi4py import MPI

from .. import collectives as mp
from .. import files
from ..trace import Tracer
from ..training import GPT, AdamW, DataParallel, data
from ..training.gpt import token_cross_entropy
from ..training.memory import formula_bytes, model_state_bytes
from ..training.trainer import blas_threads
from .output import HelpFormatter, publish, read_json

MODES = ("compute", "serial", "overlap")
MARK = ("<!-- gpt-tables -->", "<!-- /gpt-tables -->")


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mpidp.bench gpt", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads per block")
    p.add_argument("--width", type=int, default=64, help="the embedding width")
    p.add_argument("--context", type=int, default=64, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=12, help="local batch per rank (sequences)")
    p.add_argument("--bucket-mb", type=float, default=0.1, help="train_gpt.py's default")
    p.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--label", default=None, help="what the run is, for the report")
    p.add_argument("--memory", action="store_true", help="ZeRO 0/1/2 model states per rank")
    p.add_argument("--trace", metavar="FILE", help="a Chrome trace of overlapped steps")
    p.add_argument("--json", metavar="FILE", help="write the figures here (rank 0)")
    p.add_argument("--report", metavar="DIR", help="tables from DIR/*.json (no MPI run)")
    p.add_argument("--doc", metavar="FILE.md", help="with --report: write the tables here")
    return p.parse_args(argv)


def model_and_batch(args, comm):
    text = data.stdlib_text()
    model = GPT(len(text.vocab), args.context, args.layers, args.heads, args.width, seed=0)
    n = data.sequences(text.train, args.context)
    seqs = np.random.default_rng(comm.Get_rank()).integers(0, n, args.batch)
    return model, data.batch(text.train, seqs, args.context)


class Mode:
    """One of the three ways to run the step, on its own copy of the model."""

    def __init__(self, mode: str, comm, args):
        self.model, (self.x, self.y) = model_and_batch(args, comm)
        self.opt = AdamW(self.model.params, self.model.grads, lr=1e-3)
        self.ddp = None
        if mode != "compute":
            self.ddp = DataParallel(self.model, comm, args.bucket_mb, args.bucket_mb,
                                    overlap=mode != "serial", optimizer=self.opt)
        self.times = {"step": [], "backward": [], "exposed": []}

    def step(self, keep: bool) -> None:
        """One training step (the caller lines the ranks up first); its times if `keep`."""
        t0 = time.perf_counter()
        _, dlogits = token_cross_entropy((self.ddp or self.model).forward(self.x), self.y)
        if self.ddp is None:
            t1 = time.perf_counter()
            self.model.backward(dlogits)
            backward, exposed = time.perf_counter() - t1, 0.0
        else:
            self.ddp.backward(dlogits)
            backward, exposed = self.ddp.timings["backward"], self.ddp.timings["exposed_comm"]
        self.opt.step()
        if keep:
            for k, v in zip(self.times, (time.perf_counter() - t0, backward, exposed),
                            strict=True):
                self.times[k].append(v)


def run_modes(comm, args, tracer=None) -> dict:
    """The three modes' steps interleaved (compute, serial, overlap, compute, ...): a change
    of the machine's load hits all three alike. A `tracer` records the overlapped steps."""
    modes = {mode: Mode(mode, comm, args) for mode in MODES}
    for i in range(args.warmup + args.steps):
        for mode, m in modes.items():
            if tracer is not None and mode == "overlap" and i == args.warmup:
                tracer.follow(m.ddp)
            comm.Barrier()
            if tracer is not None and mode == "overlap" and i == args.warmup:
                tracer.reset_clock()  # right after the barrier: the ranks' clocks lined up
            m.step(keep=i >= args.warmup)
    out = {mode: m.times for mode, m in modes.items()}
    b = modes["overlap"].ddp.buckets
    out["layout"] = [{"bucket": k.index, "units": k.units, "names": k.names,
                      "bytes": int(k.flat.nbytes)} for k in b]
    for m in modes.values():
        if m.ddp is not None:
            m.ddp.close()
    return out


def memory(comm, args) -> list[dict]:
    """Model states per rank (the largest rank's) under ZeRO 0, 1, 2 after one AdamW step."""
    rows = []
    for zero in (0, 1, 2):
        model, (x, y) = model_and_batch(args, comm)
        opt = AdamW(model.params, model.grads, lr=1e-3)
        with DataParallel(model, comm, args.bucket_mb, args.bucket_mb, zero=zero,
                          optimizer=opt) as ddp:
            _, dlogits = token_cross_entropy(ddp.forward(x), y)
            ddp.backward(dlogits)
            ddp.step()
            held = model_state_bytes(ddp)
        mine = np.array([held["params"], held["grads"], held["optimizer"], held["total"]],
                        dtype=np.int64)
        mp.allreduce(comm, mp.IN_PLACE, mine, op="max")
        P = model.num_params()
        worst = max(formula_bytes(zero, P, 4, 2, comm.Get_size(), r)
                    for r in range(comm.Get_size()))
        rows.append({"zero": zero, "params": int(mine[0]), "grads": int(mine[1]),
                     "optimizer": int(mine[2]), "total": int(mine[3]), "formula": worst})
    return rows


def run(args) -> int:
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    tokens = size * args.batch * args.context
    out = {"ranks": size, "label": args.label or f"{size} rank(s), one host",
           "model": {"layers": args.layers, "heads": args.heads, "width": args.width,
                     "context": args.context}, "batch": args.batch, "bucket_mb": args.bucket_mb,
           "load": os.getloadavg()[0], "modes": {}}
    with blas_threads(1):
        runs = run_modes(comm, args)
        out["layout"] = runs.pop("layout")
        for mode, r in runs.items():
            slowest = np.array(r["step"])
            mp.allreduce(comm, mp.IN_PLACE, slowest, op="max")  # a step lasts as its slowest
            step = float(np.median(slowest))
            out["modes"][mode] = {"step_ms": 1e3 * step, "tokens_per_s": tokens / step,
                                  "backward_ms": 1e3 * float(np.median(r["backward"])),
                                  "exposed_comm_ms": 1e3 * float(np.median(r["exposed"]))}
        m = out["modes"]
        hidden = m["serial"]["step_ms"] - m["overlap"]["step_ms"]
        cost = m["serial"]["step_ms"] - m["compute"]["step_ms"]
        hideable = min(m["serial"]["exposed_comm_ms"], m["compute"]["backward_ms"])
        alone = size == 1  # nothing to hide: no figure rather than a ratio of noise
        out.update(hidden_ms=hidden,
                   hidden_fraction=hidden / cost if cost > 0 and not alone else None,
                   efficiency=hidden / hideable if hideable > 0 and not alone else None)
        model, _ = model_and_batch(args, comm)
        out["params"] = model.num_params()
        if args.memory:
            out["memory"] = memory(comm, args)
        if args.trace:
            tracer = Tracer(comm.Get_rank())
            run_modes(comm, argparse.Namespace(**{**vars(args), "steps": 1}), tracer)
            tracer.write(args.trace, comm)
    if comm.Get_rank() == 0:
        print(json.dumps({k: v for k, v in out.items() if k not in ("layout", "memory")}))
        if args.json:
            files.write_json(args.json, out, indent=1)
    return 0


# ---------------------------------------------------------------- the page's tables

def tables(runs: list[dict]) -> list[str]:
    lines = ["| run | mode | step ms | tokens/s | backward ms | exposed comm ms | hidden "
             "fraction | efficiency | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for mode, e in r["modes"].items():
            extra = ("", "")
            if mode == "overlap":
                extra = tuple("" if v is None else f"{v:.2f}"
                              for v in (r["hidden_fraction"], r["efficiency"]))
            lines.append(f"| {r['label']} | {mode} | {e['step_ms']:.1f} | "
                         f"{e['tokens_per_s']:.0f} | {e['backward_ms']:.1f} | "
                         f"{e['exposed_comm_ms']:.1f} | {extra[0]} | {extra[1]} | "
                         f"{r['load']:.1f} |")
    first = next((r for r in runs if "layout" in r), None)
    if first is not None:
        lines += ["", f"Bucket layout of the default model ({first['params']} parameters, "
                  f"float32, `--bucket-mb {first['bucket_mb']}`; backward's order):", "",
                  "| bucket | units | KiB | parameters |", "|---|---|---|---|"]
        for b in first["layout"]:
            names = ", ".join(b["names"])
            lines.append(f"| {b['bucket']} | {', '.join(map(str, b['units']))} | "
                         f"{b['bytes'] / 1024:.1f} | {names} |")
    for r in runs:
        if "memory" in r:
            lines += ["", f"Model states per rank, {r['label']} (AdamW, float32, bytes; "
                      "formula: memory.formula_bytes):", "",
                      "| ZeRO | params | grads | optimizer | total | formula |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {m['zero']} | {m['params']} | {m['grads']} | {m['optimizer']} | "
                      f"{m['total']} | {m['formula']} |" for m in r["memory"]]
    return lines


def report(args) -> int:
    runs = []
    for path in sorted(glob.glob(os.path.join(args.report, "*.json"))):
        r = read_json(path)
        if "modes" in r:
            runs.append(r)
    runs.sort(key=lambda r: ("hosts" in r["label"], r["label"]))  # one host first
    return publish(tables(runs), args.doc, MARK)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv or [])
    return report(args) if args.report else run(args)
