"""Train a small GPT (a torch nn.Module) with DistributedDataParallel on mpidp's collectives.

    mpiexec -n 2 python examples/train_torch.py                       # DDP on mpidp
    mpiexec -n 2 python examples/train_torch.py --backend gloo        # the same on gloo
    mpiexec -n 3 python examples/train_torch.py --deterministic --save p.pt   # any N: same bits
    mpiexec -n 2 python examples/train_torch.py --fsdp                # FSDP2 fully_shard

The corpus is `examples/train_gpt.py`'s: the first --corpus-mb of Python's standard
library source as bytes (`mpidp.training.data.stdlib_text`), its tail held out; the
sampler (`ShardSampler`) cuts the same global batches whatever the number of ranks.
Start-up is `mpidp.torch.init_process_group` (rank and size from MPI.COMM_WORLD,
torch's store through MPI), with either backend. Rank 0 prints the held-out loss
before the first step, every --eval-every steps and after the last; the program exits
with 1 if the held-out loss did not fall.

--deterministic trains without DDP: `mpidp.torch.ExactGradients` computes every
micro-shard's gradient apart and averages them all with mpidp's exact sum, so the
parameters after training are the same bits on any number of ranks (--save writes
them; tests/test_torch_train.py compares N = 1..4).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import mpidp.torch
from mpidp import files, watchdog
from mpidp.training import ShardSampler, data
from mpidp.training.determinism import default_micro_batch

MiB = 1 << 20


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)  # (B, H, T, T)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, heads: int, width: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx):  # (B, T) token ids -> (B, T, V) logits
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train_torch.py", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("mpidp", "gloo"), default="mpidp")
    p.add_argument("--deterministic", action="store_true",
                   help="exact gradients: the same bits on any number of ranks (mpidp only)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    p.add_argument("--algorithm", default="auto", help="mpidp's all-reduce algorithm")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--global-batch", type=int, default=16, help="samples per step, all ranks")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="--deterministic's micro-shard (0: from the global batch alone)")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--bucket-mb", type=float, default=0.25, help="DDP's bucket_cap_mb")
    p.add_argument("--corpus-mb", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-tokens", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1, help="torch's compute threads per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="FILE", help="rank 0 saves the final parameters here")
    args = p.parse_args(argv)
    if args.deterministic and (args.backend != "mpidp" or args.fsdp):
        p.error("--deterministic needs --backend mpidp, without --fsdp")
    for name in ("steps", "global_batch", "context", "layers", "heads", "width", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.width % args.heads:
        p.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    return args


def evaluate(model, tokens, seqs, context: int, group) -> float:
    """Mean loss per token over every rank's `seqs` (a SUM all-reduce)."""
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for k in range(0, len(seqs), 32):
            x, y = (torch.from_numpy(a) for a in data.batch(tokens, seqs[k:k + 32], context))
            total += torch.tensor([float(loss_of(model, x, y)) * y.numel(), y.numel()])
    dist.all_reduce(total, group=group)
    return float(total[0] / max(float(total[1]), 1.0))


def wrap(args, model, group):
    """The model under DDP, FSDP2 or (--deterministic) nothing, and its gradient step."""
    if args.deterministic:
        micro = args.micro_batch or default_micro_batch(args.global_batch)
        exact = mpidp.torch.ExactGradients(model, group, micro_batch=micro)
        return model, lambda x, y: exact.backward(lambda a, b: loss_of(model, a, b), x, y)
    if args.fsdp:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    else:
        wrapped = nn.parallel.DistributedDataParallel(model, process_group=group,
                                                      bucket_cap_mb=args.bucket_mb)

    def step(x, y):
        loss = loss_of(wrapped, x, y)
        loss.backward()
        mean = loss.detach().double().reshape(1)
        dist.all_reduce(mean, group=group)
        return float(mean[0]) / dist.get_world_size(group)
    return wrapped, step


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    mpidp.torch.init_process_group(args.algorithm, backend=args.backend)
    first, last, _ = train(args, dist.group.WORLD)
    dist.destroy_process_group()
    return 0 if last < first else 1


def train(args: argparse.Namespace, group) -> tuple[float, float, dict]:
    """Train on `group`; the held-out loss before and after, and the final parameters."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    torch.manual_seed(args.seed)
    torch.set_default_dtype(getattr(torch, args.dtype))
    text = data.stdlib_text(int(args.corpus_mb * MiB))
    T = args.context
    sampler = ShardSampler(data.sequences(text.train, T), args.global_batch, rank, size,
                           args.seed)
    n_val = min(data.sequences(text.val, T), args.eval_tokens // T or 1)
    val_seqs = np.arange(rank, n_val, size)
    model = GPT(len(text.vocab), T, args.layers, args.heads, args.width)
    wrapped, step = wrap(args, model, group)
    opt = (torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD)(
        model.parameters(), lr=args.lr)
    what = "exact gradients" if args.deterministic else "FSDP2" if args.fsdp else "DDP"
    if rank == 0:
        print(f"train_torch: {size} rank(s) on {args.backend}, {what}, GPT {args.layers} x "
              f"{args.width} ({sum(p.numel() for p in model.parameters())} params, "
              f"{args.dtype}), global batch {args.global_batch} x {T} tokens", flush=True)
    first = last = evaluate(wrapped, text.val, val_seqs, T, group)
    if rank == 0:
        print(f"step     0  held-out loss {first:.4f} nats/token", flush=True)
    done, epoch, t0, loss = 0, 0, time.perf_counter(), float("nan")
    while done < args.steps:
        for batch in sampler.epoch(epoch)[:, 0]:  # (steps, b): this rank's samples
            x, y = (torch.from_numpy(a) for a in data.batch(text.train, batch, T))
            opt.zero_grad(set_to_none=True)
            loss = step(x, y)
            opt.step()
            done += 1
            if done % args.eval_every == 0 or done == args.steps:
                last = evaluate(wrapped, text.val, val_seqs, T, group)
                if rank == 0:
                    rate = done * args.global_batch / (time.perf_counter() - t0)
                    print(f"step {done:5d}  loss {loss:.4f}  held-out loss {last:.4f} "
                          f"nats/token  {rate:.1f} samples/s", flush=True)
            if done == args.steps:
                break
        epoch += 1
    params = {k: full(v) for k, v in model.state_dict().items()}
    if args.save and rank == 0:
        files.replace(args.save, lambda f: torch.save(params, f))
    if rank == 0:
        print(f"held-out loss {'fell' if last < first else 'did NOT fall'} from {first:.4f} "
              f"to {last:.4f} nats/token", flush=True)
    return first, last, params


def full(t: torch.Tensor) -> torch.Tensor:
    """A parameter whole (FSDP2's are sharded DTensors: gathered, collective)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


if __name__ == "__main__":
    sys.exit(watchdog.run(main, "train_torch.py"))
