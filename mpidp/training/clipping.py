"""Global-norm gradient clipping across ranks: ``clip_grad_norm(ddp, max_norm) -> total_norm``.

After a synced backward, the gradient the optimizer will use is scaled by
``min(1, max_norm / (total_norm + 1e-6))``, where total_norm is the 2-norm of the whole
averaged gradient, all parameters together (PyTorch's ``clip_grad_norm_``). What each
rank holds decides what it adds:

    stage 0     every rank holds the whole averaged gradient (the buckets): its own
                sum of squares is the total's; no message
    ZeRO 1-3    rank r holds block r of it (``grad_shard``), the blocks disjoint: each
                rank sums its block's squares, one all-reduce (SUM) adds the N sums;
                nothing is counted twice, nothing left out

Deterministic mode (``DataParallel(..., deterministic=True)``) asks for bits that do not
depend on N, and a float sum of squares depends on where the blocks are cut. There the
sum is exact (`exact_square_sum`): every square x² of a float (float64 holds x exactly)
is split into integer terms on a fixed grid of powers of two, summed as integers
(exactly, in any order), and the ranks' integers added by an all-reduce of 32-bit limbs
in int64 (exact for any N below 2^31); the total is rounded to float64 once. Stage 0 and
every stage on every N then give the norm's, and the clipped gradient's, bits.

Cost: one all-reduce of 8 bytes (ZeRO), of 140 int64 (ZeRO, deterministic: the limbs, the
NaNs, the infinities), none at
stage 0; the local sum reads the gradient once (exact: a few NumPy passes over it).
"""

from __future__ import annotations

import math

import numpy as np

from .. import collectives as mp

EPS = 1e-6  # PyTorch's: no division by zero for a zero gradient
# x = M·2^(e-53), M < 2^53 cut in 18-bit digits: x² is 5 integer terms < 2^38 at 2e + SHIFTS
SHIFTS, DIGIT = (72, 54, 36, 18, 0), 18
E_MIN = -1073  # float64's smallest frexp exponent (the least subnormal, 2^-1074 = 0.5·2^-1073)
BINS = 2 * 1024 - 2 * E_MIN + max(SHIFTS) + 1  # every 2e + shift, from 0
CHUNK = 1 << 22  # elements per pass: a bin takes one term < 2^38 of each, < 2^60 in all
LIMB, LIMBS = 32, -(-(BINS + 128) // 32)  # the total's 32-bit limbs (138): room for 2^68 terms


def held_gradients(ddp) -> list:
    """The gradient arrays this rank adds to the norm: ZeRO's shard, or (stage 0) every bucket."""
    return [ddp.grad_shard] if ddp.zero else [b.flat for b in ddp.buckets]


def square_sum_int(arrays) -> tuple[int, int, int]:
    """The exact sum of the squares of the finite elements of `arrays` (NumPy floats), as an
    integer T (the sum is T·2^(2·E_MIN - 106)); and how many are NaN, how many infinite."""
    total, nans, infs = 0, 0, 0
    mask = (1 << DIGIT) - 1
    for g in arrays:
        flat = np.abs(np.asarray(g, dtype=np.float64).reshape(-1))
        for lo in range(0, flat.size, CHUNK):
            x = flat[lo:lo + CHUNK]
            nans, infs = nans + int(np.isnan(x).sum()), infs + int(np.isinf(x).sum())
            m, e = np.frexp(x[np.isfinite(x) & (x != 0)])  # x = m·2^e, m in [0.5, 1)
            M = (m * 2.0 ** 53).astype(np.int64)  # exact: x = M·2^(e-53)
            a, b, c = M >> 2 * DIGIT, (M >> DIGIT) & mask, M & mask
            terms = (a * a, 2 * a * b, 2 * a * c + b * b, 2 * b * c, c * c)  # of M², each < 2^38
            bins = np.zeros(BINS, dtype=np.int64)
            for shift, term in zip(SHIFTS, terms, strict=True):
                np.add.at(bins, 2 * (e - E_MIN) + shift, term)
            total += sum(int(v) << j for j, v in enumerate(bins.tolist()) if v)
    return total, nans, infs


def exact_square_sum(arrays, comm=None) -> float:
    """The sum of the squares of `arrays`' elements, over `comm`'s ranks if given, exact
    then rounded once to float64, whatever the ranks or order (NaN if any element is,
    inf if any is infinite or the sum is past float64's range)."""
    total, nans, infs = square_sum_int(arrays)
    if comm is not None:
        words = [(total >> (LIMB * k)) & ((1 << LIMB) - 1) for k in range(LIMBS)]
        limbs = np.array([*words, nans, infs], dtype=np.int64)
        mp.allreduce(comm, mp.IN_PLACE, limbs, op=mp.SUM)  # < N·2^32 each: exact
        total = sum(int(v) << (LIMB * k) for k, v in enumerate(limbs[:LIMBS].tolist()))
        nans, infs = int(limbs[LIMBS]), int(limbs[LIMBS + 1])
    if nans or infs:
        return math.nan if nans else math.inf
    try:
        return total / (1 << (106 - 2 * E_MIN))  # int / int: correctly rounded
    except OverflowError:
        return math.inf


def clip_grad_norm(ddp, max_norm: float) -> float:
    """Scale the averaged gradient `ddp` holds so that its global 2-norm is at most
    `max_norm`; return the norm before clipping (collective under ZeRO).

    Call it between the synced backward and ``ddp.step()``, on every rank (under
    ``join()``: in its ``step=``, so that joined ranks call it too).
    """
    if not max_norm > 0 or not math.isfinite(max_norm):
        raise ValueError(f"max_norm must be a finite number above 0, not {max_norm!r}")
    arrays = held_gradients(ddp)
    comm = ddp.comm if ddp.zero else None  # stage 0: every rank holds it all
    if ddp.deterministic:
        squares = exact_square_sum(arrays, comm)
    else:
        mine = np.array([sum(float(ddp.model.xp.vdot(g, g)) for g in arrays)])
        if comm is not None:
            mp.allreduce(comm, mp.IN_PLACE, mine, op=mp.SUM)
        squares = float(mine[0])
    total_norm = math.sqrt(squares)
    coef = max_norm / (total_norm + EPS)
    if coef < 1:
        for g in arrays:
            g *= g.dtype.type(coef)
    return total_norm
