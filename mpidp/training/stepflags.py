"""The trainers' ``--uneven`` and ``--clip-grad``: their flags, and what a step does with them.

    --uneven         shards of unequal length, none dropped (`data.UnevenSampler`); each
                     rank runs its own steps inside `DataParallel.join()`
    --clip-grad MAX  `clip_grad_norm(ddp, MAX)` between the synced backward and the step

A trainer puts what follows each synced backward (the clipping, the step, the
checkpoint, an evaluation) in one function, which `joined` hands to ``join()``: the
ranks out of batches run it too, so every collective in it is matched.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import nullcontext

from .. import cli
from .clipping import clip_grad_norm
from .data import ShardSampler, UnevenSampler


def add_flags(p: argparse.ArgumentParser) -> None:
    """Add ``--uneven`` and ``--clip-grad`` to a trainer's parser."""
    p.add_argument("--uneven", action="store_true",
                   help="shards of unequal length (rank r about (r+1)/(1+...+N) of each "
                        "epoch, no sample dropped): the ranks run different numbers of "
                        "steps, and DataParallel.join() shadows the ones still training")
    p.add_argument("--clip-grad", type=cli.number(float, 0, above=True), default=None,
                   metavar="MAX", help="scale the averaged gradient to a global 2-norm of "
                                       "at most MAX before each step")


def sampler(args: argparse.Namespace, n_samples: int, rank: int, size: int, A: int):
    """The flags' sampler: `UnevenSampler` with --uneven, else `ShardSampler` (ValueError
    where the global batch or the shards do not fit)."""
    kind = UnevenSampler if args.uneven else ShardSampler
    return kind(n_samples, args.global_batch, rank, size, args.seed, A)


def settings(args: argparse.Namespace, size: int) -> dict:
    """What a checkpoint records of these flags (nothing when unset: older checkpoints
    resume as before); --uneven's shards depend on the rank count."""
    out = {"uneven_ranks": size} if args.uneven else {}
    return out | ({"clip_grad": args.clip_grad} if args.clip_grad else {})


def joined(args: argparse.Namespace, ddp, step: Callable[[], object]):
    """``ddp.join(step)`` with --uneven (the ranks out of batches run `step` too), else none."""
    return ddp.join(step) if args.uneven else nullcontext()


def clip(args: argparse.Namespace, ddp) -> float | None:
    """With --clip-grad, clip the averaged gradient (collective under ZeRO): its norm."""
    return clip_grad_norm(ddp, args.clip_grad) if args.clip_grad else None
