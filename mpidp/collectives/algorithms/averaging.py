"""EXACT_AVG's one rounding: the mean V/n from the summed words, never fl(V)/n.

Dividing the rounded sum rounds twice, and overflows where the sum does though
the mean is representable (float16: 60000 on 3 ranks sums to inf). The words
hold V exactly (prerounding.py), so the mean is taken from them:

- one word (float16, float32): W1 is V, a float64. q = fl64(W1/n), then the
  rounding to the dtype. Where n is a power of two, q is W1/n exactly (a float64
  divided by 2^k is exact down to 2^-1022, and a q below that rounds to ±0 in the
  dtype whatever its last bits), so out = q rounded once: nothing is in doubt.
  Otherwise rounding twice errs only where q is exactly a midpoint
  of the dtype (every such midpoint is a float64, and rounding is monotonic):
  those items, and only they, are decided exactly (`nearest`). In the normal
  range a midpoint is a bit pattern (the float64 bits below the dtype's last
  are 1, then zeros): a mask and a compare find them, a dozen passes over the
  items in all; only q of subnormal results and past the range's end takes the
  test through q's neighbours (`_one_word_edge`).
- two words (float64): V = s + t exactly (TwoSum of W1, W2), q = fl(s/n), and
  the remainder R = V - q·n (q split in halves of 26 bits, so hi·n and lo·n are
  exact; s - hi·n is exact too, both being close). The mean is q, or its
  neighbour on R's side where |R| > n·ulp(q)/2. Where R's few roundings leave
  that in doubt (a near tie, a power of two, tiny or huge items), the item is
  decided exactly.

`nearest` rounds a Fraction once to the dtype (Python's int division is
correctly rounded to float64; a float64 midpoint of a narrower dtype is moved
to the side of the exact value). The exact items are few: near ties, and the
float64 items outside prerounding's FAST range.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

SPLIT = float(2 ** 27 + 1)  # Veltkamp's constant: q = hi + lo, 26 bits each


def nearest(value: Fraction, dtype) -> float:
    """`value` rounded once to `dtype` (to nearest, ties to even; ±inf beyond the range)."""
    dt = np.dtype(dtype).newbyteorder("=")
    try:
        r64 = float(value)  # correctly rounded
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")
    with np.errstate(over="ignore"):
        r = dt.type(r64)
    if dt == np.float64 or Fraction(r64) == value:
        return float(r)
    info = np.finfo(dt)
    big = info.max
    if np.isinf(r):  # past the range's end, max + ulp/2 (a tie goes to inf: max is odd)?
        edge = Fraction(float(big)) + Fraction(2) ** (info.maxexp - 2 - info.nmant)
        return float(r) if abs(value) >= edge else float(np.copysign(float(big), r64))
    a = float(r)
    if a != r64:  # the second rounding moved it: was r64 a midpoint of dt?
        b = float(np.nextafter(r, dt.type(np.inf if r64 > a else -np.inf)))
        if np.isfinite(b) and Fraction(a) + Fraction(b) == 2 * Fraction(r64):
            return max(a, b) if value > r64 else min(a, b)
    return a


def mean(w1, w2, out, n: int, exact_of, always=()) -> None:
    """out = (the summed words' V) / n, rounded once to out's dtype.

    Args:
        w1, w2: the summed words (w2 None: one word, W1 = V).
        exact_of: ``exact_of(i)`` is item i's V as a Fraction; called only for the items
            decided exactly.
        always: items decided exactly whatever the words say (their words are scaled).
    """
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        doubt = _one_word(w1, out, n) if w2 is None else _two_words(w1, w2, out, n)
    doubt[np.asarray(always, dtype=np.intp)] = True
    for i in np.flatnonzero(doubt):
        out[i] = nearest(exact_of(int(i)) / n, out.dtype)


def _split(q):
    """q = hi + lo, each of at most 26 bits: hi·n and lo·n are exact for n < 2^26."""
    c = q * SPLIT
    hi = c - (c - q)
    return hi, q - hi


def _one_word(w1, out, n: int):
    """out = fl(q), q = fl64(W1/n); the items in doubt: q a midpoint of out's dtype that is
    not the exact mean (q·n != W1), and (`_one_word_edge`) the range's ends.

    A midpoint in the normal range is a float64 whose bits below the dtype's last are
    1 then zeros: one mask and one compare find them; only those few are tested further.
    """
    q = w1 / n
    np.copyto(out, q, casting="same_kind")
    if n & (n - 1) == 0:  # n = 2^k: q = W1/n exactly, rounded once (module doc)
        return np.zeros(q.shape, bool)
    info = np.finfo(out.dtype)
    below = 52 - int(info.nmant)  # float64 mantissa bits under the dtype's last one
    doubt = (q.view(np.int64) & ((1 << below) - 1)) == (1 << (below - 1))
    mag = np.abs(q)
    doubt &= (mag >= info.tiny) & (mag <= info.max)  # finite, the normal range
    tie = np.flatnonzero(doubt)
    if tie.size:
        hi, lo = _split(q[tie])
        doubt[tie] = (w1[tie] - hi * n) != lo * n  # q·n != W1: the tie q is not the exact mean
    edge = np.flatnonzero(((mag < info.tiny) & (q != 0)) | (mag > info.max))
    if edge.size:  # subnormal results and the range's end: the whole test, on them alone
        part = out[edge]
        doubt[edge] = _one_word_edge(w1[edge], part, n)
    return doubt


def _one_word_edge(w1, out, n: int):
    """`_one_word`'s doubt from q's neighbours in the dtype (any q; used at the range's ends)."""
    q = w1 / n
    np.copyto(out, q, casting="same_kind")
    r64 = out.astype(np.float64)
    d = q - r64  # exact: r64 is q's neighbour in the dtype
    toward = np.nextafter(out, np.where(d > 0, np.inf, -np.inf).astype(out.dtype))
    midpoint = (d != 0) & (2 * d == toward.astype(np.float64) - r64)  # of the dtype
    hi, lo = _split(q)
    inexact = (w1 - hi * n) != lo * n  # q·n != W1: the tie q is not the exact mean
    return (midpoint & inexact) | (np.isinf(out) & np.isfinite(q))  # inf: at the threshold?


def _two_words(w1, w2, out, n: int):
    s = w1 + w2
    bb = s - w1
    t = (w1 - (s - bb)) + (w2 - bb)  # V = s + t, exactly
    q = s / n
    hi, lo = _split(q)
    d = (s - hi * n) - lo * n  # s - q·n, exactly (the two are close)
    R = d + t
    bb = R - d
    err = (d - (R - bb)) + (t - bb)  # V - q·n = R + err, exactly
    half = n * np.spacing(np.abs(q)) / 2  # the remainder of a tie: n·ulp(q)/2
    tie = (err == 0) & (np.abs(R) == half)  # exactly halfway: to the even one
    odd = (q.view(np.int64) & 1).astype(bool)
    step = np.where((R > half) | (tie & odd & (R > 0)), 1.0,
                    np.where((R < -half) | (tie & odd & (R < 0)), -1.0, 0.0))
    np.copyto(out, np.where(step == 0, q, np.nextafter(q, step * np.inf)), casting="same_kind")
    mag = np.abs(q)
    tiny = (mag < 2.0 ** -960) & ((s != 0) | (t != 0))  # (V = 0 exactly: q = 0 is right)
    near = ~tie & (np.abs(np.abs(R) - half) <= 2 * np.abs(err) + np.spacing(half))
    return (near | (np.abs(R) > 2.5 * half) | (np.frexp(mag)[0] == 0.5) | ~np.isfinite(q)
            | tiny | (mag > 2.0 ** 960))
