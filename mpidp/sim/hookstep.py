"""`sim step --comm-hook`: a bucket's compressed reduction in the cost model, and where it pays.

A hook (`mpidp.training.hooks`) changes two things of a bucket's reduction: the bytes on
the wire and the local work. For a bucket of G float32 bytes on N ranks (`ppn` a host):

    none        the all-reduce of G (`step.choose`: the algorithm's real schedule)
    fp16, bf16  a direct reduce-scatter, then a direct all-gather, of G/2 bytes of words:
                2 rounds of N - 1 messages, (G/2)(N-1)/N bytes a rank sends in each, the
                host link carrying ppn·(N-ppn)/N·G/2 a round; γ·G(N-1)/N of float32
                sums; and 2 round trips of G through the 16-bit words (rounding the
                input and widening the N blocks; rounding the average and widening the
                all-gathered words)
    powersgd:R  two all-reduces (`step.choose`), of (sum m·r + the small tensors) and of
                (sum n·r) items, one after the other, and the factors' products and QR

The local work is measured here, on this machine, as `sim profile` measures the compute:
each hook runs on the model's own buckets on ``MPI.COMM_SELF`` (one rank: every product
of PowerSGD, one round trip of fp16/bf16, no message), median of `repeats`.

`crossover` finds the host link rate below which a hook's step is faster than none's.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from mpi4py import MPI

from mpidp.collectives import waitall
from mpidp.training import hooks
from mpidp.training.buckets import make_buckets
from mpidp.training.compress import Compress16
from mpidp.training.powersgd import PowerSGD

from .step import Cost, Net, choose

MiB = 1 << 20


def measure(m, buckets, names: list[str], repeats: int = 5) -> dict[str, list[float]]:
    """Hook name -> the seconds of its local work on each bucket (one rank, no message)."""
    rng = np.random.default_rng(0)
    grads = hooks.grad_buckets(m, buckets, "auto")
    out = {}
    for name in names:
        hook = hooks.parse(name)
        if hook is None:
            out[name] = [0.0] * len(buckets)
            continue
        times = []
        for b in buckets:
            runs = []
            for run in range(repeats + 1):  # the first: a warm-up (and PowerSGD's planning)
                b.flat[...] = rng.standard_normal(b.flat.size)
                t0 = time.perf_counter()
                waitall([hook(MPI.COMM_SELF, grads[b.index])])
                if run:
                    runs.append(time.perf_counter() - t0)
            times.append(statistics.median(runs))
        if hasattr(hook, "close"):
            hook.close()
        out[name] = times
    return out


def factored(hook: PowerSGD, m, names: list[str]) -> tuple[int, int]:
    """PowerSGD's items of a bucket's two all-reduces: (P's and the small tensors', Q's)."""
    p = q = 0
    for name in names:
        shape = m.grads[name].shape
        r = hook.width(shape)
        if r:
            p, q = p + shape[0] * r, q + shape[1] * r
        else:
            p += m.grads[name].size
    return p, q


def compressed16(nbytes: float, N: int, ppn: int, net: Net, local_s: float) -> Cost:
    """fp16/bf16's reduction of a bucket of `nbytes` float32 bytes (see the module)."""
    if N == 1:
        return Cost(local_s, 0.0, np.zeros(0), 0.0, 0.0, "direct16")
    ppn = ppn or N
    words = nbytes / 2
    sent = words * (N - 1) / N  # a rank's, each round
    link = ppn * words * (N - ppn) / N  # a host link's, each round (0 on one host)
    alpha = net.alpha_link if ppn < N else net.alpha
    wire = 2 * max(sent * net.beta, link * net.beta_link)
    fixed = net.fixed + 2 * (N - 1) * alpha + nbytes * (N - 1) / N * net.gamma + 2 * local_s
    return Cost(fixed, wire, np.array([0.5, 1.0]), 2 * link, 2 * sent, "direct16")


def powersgd(items: tuple[int, int], item: int, algorithm: str, N: int, ppn: int, net: Net,
             cache: dict, local_s: float) -> Cost:
    """PowerSGD's two all-reduces of a bucket, one after the other, and its local work."""
    if N == 1:
        return Cost(local_s, 0.0, np.zeros(0), 0.0, 0.0, "powersgd")
    p, q = (choose("allreduce", algorithm, k * item, N, ppn, net, cache) for k in items)
    whole = p.fixed + p.wire + q.fixed + q.wire
    first = (p.fixed + p.wire) / whole if whole else 0.5
    marks = np.concatenate([p.marks * first, first + q.marks * (1 - first)])
    return Cost(p.fixed + q.fixed + local_s, p.wire + q.wire, marks, p.link + q.link,
                p.sent + q.sent, f"powersgd/{p.algorithm}")


class Hooked:
    """``cost_of(k, reduction)`` for `step.predict`: bucket k's reduction under a hook."""

    def __init__(self, name: str, m, buckets, local: list[float], dtype: str, algorithm: str):
        self.name, self.hook, self.local = name, hooks.parse(name), local
        self.items = ([factored(self.hook, m, b.names) for b in buckets]
                      if isinstance(self.hook, PowerSGD) else None)
        self.itemsize, self.algorithm = np.dtype(dtype).itemsize, algorithm

    def cost_of(self, N: int, ppn: int, net: Net, cache: dict):
        def of(k: int, r) -> Cost:
            if self.hook is None:
                return choose("allreduce", self.algorithm, r.nbytes, N, ppn, net, cache)
            if isinstance(self.hook, Compress16):
                return compressed16(r.nbytes, N, ppn, net, self.local[k])
            return powersgd(self.items[k], self.itemsize, self.algorithm, N, ppn, net, cache,
                            self.local[k])
        return of


def hooked(m, args) -> dict[str, Hooked]:
    """Each hook of ``args.comm_hook`` and none (what each is compared with), its local work
    measured on the buckets DataParallel makes of `m` with the flags' caps."""
    buckets = make_buckets(m, args.bucket_mb * MiB, min(args.first_bucket_mb, args.bucket_mb) * MiB)
    names = list(dict.fromkeys(["none", *args.comm_hook]))
    local = measure(m, buckets, names)
    return {name: Hooked(name, m, buckets, local[name], args.dtype, args.algorithm)
            for name in names}


def crossover(step_s, low: float = 1e-3, high: float = 1e3, steps: int = 40) -> str:
    """The link rate (Gbit/s) below which the hook pays, from ``step_s(rate) -> (hook's
    step s, none's step s)``: bisection on a log scale in [low, high]; words where the
    sign does not change."""
    def pays(rate: float) -> bool:
        hooked, plain = step_s(rate)
        return hooked < plain

    if pays(high):
        return f"pays at every rate up to {high:g} Gbit/s"
    if not pays(low):
        return f"does not pay at any rate down to {low:g} Gbit/s"
    lo, hi = np.log(low), np.log(high)
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pays(float(np.exp(mid))) else (lo, mid)
    return f"pays below {float(np.exp(lo)):.3g} Gbit/s"
