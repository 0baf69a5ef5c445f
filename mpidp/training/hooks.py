"""Communication hooks: what travels for a bucket instead of its float32 gradient.

``DataParallel(model, comm, comm_hook=hook)`` hands each bucket's reduction to the hook
(as PyTorch DDP's ``register_comm_hook``). The protocol:

    hook(comm, bucket) -> request
        comm     the buckets' communicator (N = ``comm.Get_size()`` ranks)
        bucket   a `GradBucket`: ``index``, ``buffer`` (the bucket's flat gradient, this
                 rank's sum), ``params`` (name, offset, shape of each gradient in it),
                 ``algorithm`` (DataParallel's all-reduce name, for the hook's own)
        request  anything with ``Test()`` (advance without blocking; True once complete),
                 ``done``, ``rounds``, ``completed_at``: DataParallel tests it between
                 backward's units and waits for it like a plain bucket's all-reduce. Once
                 complete, ``buffer`` holds the rank average, the same bits on every rank.
    hook.close()  (optional) frees what the hook planned, at ``DataParallel.close()``

Every rank calls the hook for the same buckets in the same order. A hook may keep state
per ``bucket.index`` (error feedback, warm starts): one hook object per DataParallel.
`Steps` turns a generator that yields lists of requests into such a request, so a hook
reads as its steps (both in `gradbucket.py`). The shipped hooks (`parse` names them, as
the trainers' ``--comm-hook``): `compress.Compress16` (``fp16``, ``bf16``) and
`powersgd.PowerSGD` (``powersgd:R``).

Refused: ZeRO (its reduce-scatter is the reducer's), ``deterministic=True`` (a rounded
gradient is not the exact sum's), a progress thread (a hook's later steps start
collectives from the thread that tests it), GPU arrays (the words are NumPy's), for
fp16/bf16 any gradient dtype but float32, and in the trainers PowerSGD with ``--resume``
(a checkpoint holds no hook state). A hook reduces whole buckets (no ``piece_mb``).
"""

from __future__ import annotations

import argparse

import numpy as np

from .compress import FORMATS, Compress16
from .gradbucket import GradBucket
from .powersgd import PowerSGD

HOOKS = ("none", "fp16", "bf16", "powersgd:R")


def parse(text: str):
    """A hook from its name: ``none`` (None), ``fp16``, ``bf16``, ``powersgd:R`` (R >= 1).

    ValueError, naming the value and the choices, for anything else.
    """
    if text == "none":
        return None
    if text in FORMATS:
        return Compress16(text)
    head, _, rank = text.partition(":")
    if head == "powersgd" and rank.isdigit() and rank.isascii() and int(rank) >= 1:
        return PowerSGD(int(rank))
    raise ValueError(f"comm hook {text!r}: expected one of {', '.join(HOOKS)} (R an integer >= 1)")


def flag(text: str) -> str:
    """An argparse type for ``--comm-hook``: the name, checked (`parse`), kept as text."""
    try:
        parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("comm hook ")) from None
    return text


FLAGS = {"hook": "--comm-hook", "zero": "--zero", "det": "--deterministic", "cpu": "--device cpu",
         "thread": "--progress-thread"}
ARGUMENTS = {"hook": "comm_hook", "zero": "zero >= 1", "det": "deterministic=True",
             "cpu": "NumPy arrays", "thread": "progress_thread"}


def refused(hook, zero: int, deterministic: bool, dtypes, device: bool, thread: bool = False,
            words: dict = FLAGS) -> str | None:
    """Why `hook` cannot run with these settings (None: it can), in `words` (the flags'
    or `ARGUMENTS`, DataParallel's)."""
    if hook is None:
        return None
    w = words
    if zero:
        return f"{w['hook']} with {w['zero']}: ZeRO's reduce-scatter is the reducer's, not a hook's"
    if deterministic:
        return f"{w['hook']} with {w['det']}: a compressed gradient is not the exact sum's"
    if thread:  # a hook's later steps start collectives from whichever thread tests it
        return f"{w['hook']} with {w['thread']}: a hook's steps start collectives on one thread"
    if device:
        return f"{w['hook']} needs NumPy gradients ({w['cpu']}): its words are NumPy arrays"
    bad = sorted({str(np.dtype(d)) for d in dtypes} - {"float32"})
    if isinstance(hook, Compress16) and bad:
        return f"{w['hook']} {hook.fmt} compresses float32 gradients, not {', '.join(bad)}"
    return None


def args_refused(args) -> str | None:
    """Why the trainer's ``--comm-hook`` cannot run with its other flags (None: it can).
    PowerSGD's state (its Q, its residuals) is not in a checkpoint: no ``--resume``."""
    hook = parse(args.comm_hook)
    if hook is not None and getattr(args, "uneven", False):
        return (f"--comm-hook {args.comm_hook} with --uneven: join() shadows a step with zero "
                "gradients, which a hook's error feedback would not keep at zero")
    if isinstance(hook, PowerSGD) and args.resume:
        return (f"--comm-hook {args.comm_hook} with --resume: a checkpoint does not hold "
                "PowerSGD's state (its Q and residuals), the run would not continue")
    return refused(hook, args.zero, args.deterministic, [args.dtype], args.device == "gpu",
                   bool(args.progress_thread))


def check(comm_hook, zero: int, deterministic: bool, model, thread=None):
    """The hook DataParallel uses (a name parsed), or None; ValueError where it cannot run."""
    hook = parse(comm_hook) if isinstance(comm_hook, str) else comm_hook
    if hook is None:
        return None
    if not callable(hook):
        raise TypeError(f"comm_hook must be a name ({', '.join(HOOKS)}) or callable, "
                        f"not {type(hook).__name__}")
    why = refused(hook, zero, deterministic, [g.dtype for g in model.grads.values()],
                  model.xp is not np, thread is not None, ARGUMENTS)
    if why is not None:
        raise ValueError(why)
    return hook


def grad_buckets(model, buckets, algorithm) -> dict[int, GradBucket]:
    """Each bucket as its hook sees it: index -> `GradBucket`."""
    out = {}
    for b in buckets:
        params, offset = [], 0
        for name in b.names:
            params.append((name, offset, tuple(model.grads[name].shape)))
            offset += model.grads[name].size
        out[b.index] = GradBucket(b.index, b.flat, params, algorithm)
    return out
