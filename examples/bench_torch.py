"""Samples/s of train_torch.py's GPT under DDP on mpidp and on gloo, in the same job.

    mpiexec -n 2 python examples/bench_torch.py                      # the default model
    mpiexec -n 2 python examples/bench_torch.py --width 256 --layers 3   # >= 8 MiB of gradients
    python -m mpidp.cluster run --hosts 2 --rate 1gbit -- python examples/bench_torch.py

One job, both backends: the world group is mpidp's, a gloo group of the same ranks
beside it; --runs rounds, each timing both backends one after the other (so that load
falls on both alike), and the medians over the rounds. For each backend three modes of
a training step (forward, backward, optimizer step), as `python -m mpidp.bench overlap`
defines them:

    compute   DDP under no_sync(): no communication at all (backward alone is timed too)
    serial    no_sync(), then the gradients all-reduced after backward in DDP's buckets
              (reversed order, --bucket-mb each): the same reductions, nothing hidden
    overlap   plain DDP: buckets reduced while backward runs (what training does)

and the overlap efficiency (serial - overlap) / min(serial's communication, compute's
backward): the share of the hideable communication that the overlap hid. Rank 0
prints one row per backend and mode; --json writes them (mpidp.files).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch  # noqa: E402 (the model and its loss, from beside this file)

import mpidp.torch  # noqa: E402
from mpidp import files, watchdog  # noqa: E402

MODES = ("compute", "serial", "overlap")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_torch.py", description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=10, help="timed steps per mode and round")
    p.add_argument("--runs", type=int, default=3, help="rounds (medians over them)")
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--algorithm", default="auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--progress-interval", type=float, default=1e-4, metavar="S",
                   help="mpidp's progress thread's sleep between idle passes (Options)")
    p.add_argument("--json", metavar="FILE")
    return p.parse_args(argv)


def buckets(tensors, cap_bytes: float) -> list[list]:
    """`tensors` in DDP's order of reduction (the last first), cut into buckets of at
    least `cap_bytes` (the last one less)."""
    out, bucket, size = [], [], 0
    for t in reversed(tensors):
        bucket.append(t)
        size += t.numel() * t.element_size()
        if size >= cap_bytes:
            out.append(bucket)
            bucket, size = [], 0
    return out + [bucket] if bucket else out


def reduce_in_buckets(grads, cap_bytes: float, all_reduce) -> None:
    """Each bucket of `grads` flattened, reduced by one `all_reduce(flat)`, copied back:
    the reductions DDP makes during backward, made after it. (Reducing each gradient by
    itself instead costs a backend one call per tensor, which DDP never pays: with gloo
    that made the serial step slower than any overlap could explain, an efficiency > 1.)"""
    for bucket in buckets(grads, cap_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        all_reduce(flat)
        at = 0
        for g in bucket:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()


def time_mode(ddp, opt, x, y, mode: str, steps: int, group, cap: float) -> dict:
    """Median step, backward and communication times (ms) of `steps` steps, the slowest
    rank's (each step starts at a barrier); `cap`: the bucket size in bytes."""
    rows = []
    for _ in range(steps + 1):  # the first one warms up
        dist.barrier(group=group)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with ddp.no_sync() if mode != "overlap" else _Null():
            loss = train_torch.loss_of(ddp, x, y)
            tb = time.perf_counter()
            loss.backward()
        t1 = time.perf_counter()
        if mode == "serial":
            reduce_in_buckets([p.grad for p in ddp.parameters()], cap,
                              lambda t: dist.all_reduce(t, group=group))
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        rows.append(torch.tensor([t3 - t0, t1 - tb, t2 - t1], dtype=torch.float64))
    times = torch.stack(rows[1:])
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    step, backward, comm = (1e3 * times[:, i].median().item() for i in range(3))
    return {"step_ms": step, "backward_ms": backward, "exposed_comm_ms": comm}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measure(args, group, vocab: int) -> dict:
    torch.manual_seed(0)
    model = train_torch.GPT(vocab, args.context, args.layers, args.heads, args.width)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group,
                                              bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randint(0, vocab, (args.batch, args.context))
    y = torch.randint(0, vocab, (args.batch, args.context))
    cap = args.bucket_mb * (1 << 20)
    return {mode: time_mode(ddp, opt, x, y, mode, args.steps, group, cap) for mode in MODES}


def _two(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    mpidp.torch.init_process_group(args.algorithm, progress_interval_s=args.progress_interval)
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"mpidp": dist.group.WORLD,
              "gloo": dist.new_group(list(range(size)), backend="gloo")}
    vocab = 96  # about the corpus's byte vocabulary
    params = sum(p.numel() for p in train_torch.GPT(vocab, args.context, args.layers,
                                                    args.heads, args.width).parameters())
    runs = {name: [] for name in groups}
    for _ in range(args.runs):
        for name, group in groups.items():
            runs[name].append(measure(args, group, vocab))
    rows = []
    for name in groups:
        med = {mode: {k: statistics.median(r[mode][k] for r in runs[name])
                      for k in runs[name][0][mode]} for mode in MODES}
        hideable = min(med["serial"]["exposed_comm_ms"], med["compute"]["backward_ms"])
        eff = ((med["serial"]["step_ms"] - med["overlap"]["step_ms"]) / hideable
               if hideable > 0 else None)  # (JSON null, not NaN: strict readers refuse NaN)
        for mode in MODES:
            rows.append({"backend": name, "mode": mode, **med[mode],
                         "samples_per_s": 1e3 * args.batch * size / med[mode]["step_ms"],
                         "efficiency": eff if mode == "overlap" else None})
    if rank == 0:
        load = os.getloadavg()[0]
        print(f"bench_torch: {size} rank(s), GPT {args.layers} x {args.width} ({params} "
              f"params, {params * 4 / 2**20:.2f} MiB of float32 gradients), batch "
              f"{args.batch}/rank, medians of {args.runs} runs x {args.steps} steps, "
              f"load {load:.1f}")
        print(f"{'backend':8s} {'mode':8s} {'step ms':>9s} {'comm ms':>9s} {'samples/s':>10s} "
              f"{'efficiency':>10s}")
        for r in rows:
            eff = "" if r["mode"] != "overlap" else _two(r["efficiency"])
            print(f"{r['backend']:8s} {r['mode']:8s} {r['step_ms']:9.2f} "
                  f"{r['exposed_comm_ms']:9.2f} {r['samples_per_s']:10.1f} {eff:>10s}")
        speed = {r["backend"]: r["samples_per_s"] for r in rows if r["mode"] == "overlap"}
        print(f"mpidp / gloo samples/s (overlap): {speed['mpidp'] / speed['gloo']:.2f}x")
        if args.json:
            files.write_json(args.json, {"ranks": size, "params": params, "load": load,
                                         "runs": args.runs, "rows": rows})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(watchdog.run(main, "bench_torch.py"))
