"""EXACT_SUM and EXACT_AVG: a sum whose bits depend only on the addends, as a multiset.

Float addition is not associative: (1e16 + 1) - 1e16 is 0.0, (1e16 - 1e16) + 1 is
1.0, so a ring, a halving tree and one rank summing the same numbers disagree in
the last bits. Pre-rounding (Demmel and Nguyen, ARITH 2013 and IEEE TC 2015;
ReproBLAS) makes the sum independent of the order: agree on a grid per item,
round every addend to it, add the rounded addends as integers (which are
associative), convert back once. Three passes, each an ordinary collective:

    1. MAX all-reduce of a 1- or 2-byte code per item: its largest exponent e
       (|x| < 2^e for every addend), or "inf/nan here", or "only -0.0 here".
    2. every rank cuts each addend into integer words on the grid of e:

           bit  e-1                                    e-B        e-2B
                |<------------- word 1: B bits ------->|<-- word 2 ->|
         x_a    +--------------------------+
         x_b              +-----------------------------------+
         x_c    +-------------+                      (bits below e-2B are cut off)
                 q1 = trunc(x·2^(B-e))       q2 = trunc(frac·2^B)

       and the SUM all-reduce of the words runs with the chosen algorithm; any
       order gives the same integers (int64 addition is exact while the sum fits,
       B = 62 - ceil(log2 n) bits for n addends; float64 words hold integers
       below 2^53 exactly, B = 53 - ceil(log2 n)).
    3. every rank converts the summed words to the float nearest to them.

float64 addends take two int64 words (the grid 2^(e-2B)), float32 and float16 one
float64 word (2^(e-B)). Each item depends only on its own addends and their
count n (``addends``), never on the rank count, the algorithm, where the addends
are or the rest of the buffer. The grid also depends on n, the caller's to say
(`iallreduce_parts`): a plain all-reduce has n = N addends.

Error bound. S the exact sum, R the result, u = 2^-p the unit roundoff (p = 53,
24, 11), h the last word's grid step (2^(e-2B), or 2^(e-B)). Cutting each addend
off at h loses less than h; the words' sum V is exact; step 3 rounds V to
nearest, so

    |R - S| <= u/(1+u)·|S| + (1+u)·n·h

while pairwise summation's bound is γ_k·Σ|x_i|, k = ceil(log2 n), γ_k = ku/(1-ku)
(Higham, Accuracy and Stability, §4.2). With Σ|x_i| >= 2^(e-1) the second term fits
into γ_k·Σ|x_i| - u/(1+u)·Σ|x_i| for n <= 2^24 (float64), 2^15 (float32), 2^21
(float16); larger n are refused. (For n = 2 this is nearly correct rounding: the
room is 2u²·Σ|x_i|, which is why float64 needs two words.) One addend is exact.
Results in the subnormal range are exact where the grid reaches them.

Special values, by fixed rules: a NaN addend gives the canonical quiet NaN, +inf
with -inf gives NaN, else an infinite addend gives that infinity; an exact zero is
+0.0 unless every addend is -0.0; a finite sum beyond the range is ±inf. Integer
dtypes take plain SUM (already exact). EXACT_AVG is the exact sum divided by n,
rounded once more.

Cost (G bytes of float64 on N ranks, algorithm A with cost (rounds, bytes) per
G): the code pass A(G/4) and the words A(2G): 2.25 times the bytes of SUM and
twice its rounds; float32: A(G/4) + A(2G), float16: A(G/2) + A(4G). The
conversions are a few passes over the data, in place in pooled scratch.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from .blocks import Blocks
from .ops import MAX, SUM
from .schedule import Rounds

LITTLE = sys.byteorder == "little"


class Grid(NamedTuple):
    """What the dtype and the number of addends n decide."""

    dtype: np.dtype  # the addends'
    code: np.dtype  # the pre-pass code: the biased exponent (uint16, uint8)
    word: np.dtype  # int64 (float64 addends) or float64 (float32, float16)
    words: int  # words per item
    bits: int  # B, bits per word
    top: int  # the code of inf and nan: every exponent bit set
    mant: int  # mantissa bits stored (52, 23, 10)
    bias: int  # exponent bias (1023, 127, 15)
    addends: int


LIMIT = {"float64": 24, "float32": 15, "float16": 21}  # log2 of the most addends the bound allows


def grid(dtype, addends: int) -> Grid:
    """The grid for `addends` addends of `dtype` (float16, float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype.name not in LIMIT:
        raise TypeError(f"exact sum of {dtype}: only float16, float32 and float64 "
                        "(integers take SUM)")
    k = max(int(addends) - 1, 0).bit_length()  # ceil(log2 n)
    if addends < 0 or k > LIMIT[dtype.name]:
        raise ValueError(f"exact sum of {addends} addends of {dtype}: the error bound holds for "
                         f"1 to 2^{LIMIT[dtype.name]} addends")
    info = np.finfo(dtype)
    mant, bias = info.nmant, info.maxexp - 1
    if dtype == np.float64:
        return Grid(dtype, np.dtype(np.uint16), np.dtype(np.int64), 2, 62 - k, 2047, mant, bias,
                    addends)
    top = 2 * info.maxexp - 1
    return Grid(dtype, np.dtype(np.uint8), np.dtype(np.float64), 1, 53 - k, top, mant, bias,
                addends)


# ------------------------------------------------------------ step 1: the code of each item


def _top16(x):
    """The 16 high bits of each item (sign, exponent, first mantissa bits), a view."""
    v = x.view(np.uint16)
    per = x.itemsize // 2
    return v[per - 1 :: per] if LITTLE else v[::per]


def codes(x, out, tmp16, first: bool) -> None:
    """out = (first ? code(x) : max(out, code(x))): the biased exponent, except that zero
    and subnormals code 1 if positive, 0 if negative (0 everywhere: only -0.0 and negative
    subnormals, whose sum is zero only if all are -0.0)."""
    hi = _top16(x)
    shift = 16 - (x.itemsize * 8 - np.finfo(x.dtype).nmant - 1)  # 16 - exponent bits
    np.left_shift(hi, 1, out=tmp16)  # drop the sign
    dst = out if first else tmp16
    np.right_shift(tmp16, shift, out=dst, casting="unsafe")
    np.bitwise_or(dst, hi < (1 << (shift - 1)), out=dst, casting="unsafe")  # +0, +subnormal
    if not first:
        np.maximum(out, tmp16, out=out, casting="unsafe")


# ------------------------------------------------------------ step 2: the words


def scales(code, g: Grid, kf) -> None:
    """kf = B - e per item (x·2^kf < 2^B), e from the agreed code; special items: any."""
    np.maximum(code, 1, out=kf, casting="unsafe")
    np.subtract(g.bits + g.bias - 1, kf, out=kf)


def to_words(x, kf, w, g: Grid, y, tmp, first: bool) -> None:
    """w (+)= the words of addend `x` on the grid (`kf`), item by item; y, tmp: scratch."""
    if g.words == 1:  # one float64 word: trunc(x·2^(B-e)), an integer below 2^B
        dst = w if first else y
        np.ldexp(x, kf, out=dst, signature=(np.float64, np.int64, np.float64))
        np.trunc(dst, out=dst)
        if not first:
            np.add(w, y, out=w)
        return
    w1, w2 = w[0::2], w[1::2]
    np.ldexp(x, kf, out=y)  # exact: a power of two, |y| < 2^B
    d1, d2 = (w1, w2) if first else (tmp, tmp)
    np.copyto(d1, y, casting="unsafe")  # q1 = trunc(y), at most 53 bits: exact as a float
    np.subtract(y, d1, out=y)  # the fraction, exact
    if not first:
        np.add(w1, tmp, out=w1)
    np.multiply(y, float(2 ** g.bits), out=d2, casting="unsafe")  # q2 = trunc(frac·2^B)
    if not first:
        np.add(w2, tmp, out=w2)


def specials(parts, code, w, g: Grid) -> np.ndarray:
    """Items with an inf or nan addend somewhere: their words count +inf and -inf (nan
    counts as both). Returns their indices."""
    idx = np.flatnonzero(code == g.top)
    if idx.size == 0:
        return idx
    plus = np.zeros(idx.size, np.int64)
    minus = np.zeros(idx.size, np.int64)
    for x in parts:
        xs = x[idx]
        nan = np.isnan(xs)
        plus += (xs == np.inf) | nan
        minus += (xs == -np.inf) | nan
    if g.words == 2:
        w[2 * idx], w[2 * idx + 1] = plus, minus
    else:
        w[idx] = plus + minus * float(1 << 24)
    return idx


# ------------------------------------------------------------ step 3: back to floats


def from_words(w, code, kf, out, g: Grid, a, b) -> None:
    """out = the float nearest to the summed words (kf: as `scales` left it; a, b: int64
    scratch of out's size). Specials and -0.0 are set afterwards (`finish`)."""
    if g.words == 1:  # V·2^(e-B) is exact in float64; one rounding to out's dtype
        np.negative(kf, out=kf)
        np.ldexp(w, kf, out=out, casting="unsafe", signature=(np.float64, np.int64, np.float64))
        return
    t1, t2 = w[0::2], w[1::2]
    B = g.bits
    # carry: V = t1·2^B + t2 with 0 <= t2 < 2^B
    np.right_shift(t2, B, out=a)
    np.add(t1, a, out=t1)
    np.left_shift(a, B, out=a)
    np.subtract(t2, a, out=t2)
    # s: how far t1 shifts left so that Z = floor(V / 2^(B-s)) holds about 61 bits
    np.right_shift(t1, 63, out=a)
    np.bitwise_xor(a, t1, out=a)  # m = |t1|, or |t1| - 1 if negative (-1 -> 0: V fits)
    f = out.view(np.int64)
    np.copyto(out, a, casting="unsafe")  # float(m) (m >= 0)
    np.right_shift(f, 52, out=a)  # its biased exponent: 1023 + floor(log2 m), 0 for m = 0
    np.subtract(1083, a, out=a)  # 61 - bit length
    np.clip(a, 0, B, out=a)  # s
    np.left_shift(t1, a, out=t1)
    np.subtract(B, a, out=b)  # B - s: the bits of t2 below Z
    np.add(kf, a, out=kf)  # kf + s: Z·2^-(kf+s) is the value
    np.left_shift(1, b, out=a)
    np.subtract(a, 1, out=a)
    np.bitwise_and(a, t2, out=a)  # the bits cut off ...
    np.right_shift(t2, b, out=t2)
    np.add(t1, t2, out=t1)
    np.not_equal(a, 0, out=b, casting="unsafe")
    np.bitwise_or(t1, b, out=t1)  # ... as a sticky bit: Z is V rounded to odd, >= 55 bits
    np.negative(kf, out=kf)
    # one rounding to nearest: Z rounded to odd first keeps it the rounding of V
    np.ldexp(t1, kf, out=out, signature=(np.float64, np.int64, np.float64))


def special_values(w, g: Grid, idx):
    """The results of the special items `idx`, from their summed words (before
    `from_words`, which reuses the words): nan, +inf or -inf."""
    if g.words == 2:
        plus, minus = w[2 * idx] > 0, w[2 * idx + 1] > 0
    else:
        plus, minus = np.fmod(w[idx], 1 << 24) > 0, w[idx] >= (1 << 24)
    return np.where(plus & minus, np.nan, np.where(plus, np.inf, -np.inf))


def finish(code, out, g: Grid, idx, values, average: bool) -> None:
    """The fixed rules (nan, inf: `values` at `idx`; -0.0), then the average."""
    if idx.size:
        out[idx] = values
    if g.addends:
        neg = np.flatnonzero(code == 0)  # only -0.0 and negative subnormals: zero iff all -0.0
        if neg.size:
            zero = out[neg] == 0
            out[neg[zero]] = -0.0
    if average and g.addends > 1:
        np.true_divide(out, g.addends, out=out)


# ------------------------------------------------------------ the rounds


class Scratch(NamedTuple):
    """Pooled arrays of one exact collective (count items)."""

    code: object  # count, the code dtype
    code_tmp: object  # the MAX algorithm's tmp, code dtype
    tmp16: object  # count, uint16
    words: object  # count·words
    words_tmp: object  # the SUM algorithm's tmp, word dtype
    kf: object  # count, int64
    y: object  # count, float64
    a: object  # count, int64
    b: object  # count, int64


def scratch_for(pool, g: Grid, count: int, code_items: int, word_items: int) -> Scratch:
    take = pool.take

    def like(dt):
        return np.empty(0, dt)

    return Scratch(take(like(g.code), count), take(like(g.code), code_items),
                   take(like(np.uint16), count), take(like(g.word), count * g.words),
                   take(like(g.word), word_items), take(like(np.int64), count),
                   take(like(np.float64), count), take(like(np.int64), count),
                   take(like(np.int64), count))


def exact_rounds(comm, parts, out, g: Grid, code_algo, word_algo, s: Scratch,
                 average: bool = False, reduce_scatter: Blocks | None = None) -> Rounds:
    """The three passes as one generator of rounds (see the module docstring).

    Args:
        parts: this rank's addends, arrays of out's size and dtype (any number).
        out: the result (all-reduce); with `reduce_scatter` (the blocks of the items),
            this rank's block of it.
        code_algo, word_algo: the all-reduce (or reduce-scatter) generators for the
            MAX pass and the SUM pass, ``(comm, buf, blocks, op, tmp)``.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    count = s.code.size
    code = s.code
    if not parts:
        code[...] = 0
    for i, x in enumerate(parts):
        codes(x, code, s.tmp16, i == 0)
    yield from code_algo(comm, code, Blocks.even(count, n), MAX, s.code_tmp)
    kf, w = s.kf, s.words
    scales(code, g, kf)
    if not parts:
        w[...] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        for i, x in enumerate(parts):
            to_words(x, kf, w, g, s.y, s.a, i == 0)
    idx = specials(parts, code, w, g)
    if reduce_scatter is None:
        yield from word_algo(comm, w, Blocks.even(count * g.words, n), SUM, s.words_tmp)
        lo, hi = 0, count
    else:
        wb = Blocks([c * g.words for c in reduce_scatter.counts])
        yield from word_algo(comm, w, wb, SUM, s.words_tmp)
        lo = reduce_scatter.displs[rank]
        hi = lo + reduce_scatter.counts[rank]
    span = slice(lo, hi)
    w, code, kf = w[lo * g.words : hi * g.words], code[span], kf[span]
    y = s.y[: hi - lo] if out.dtype != np.float64 else out
    idx = idx[(idx >= lo) & (idx < hi)] - lo
    values = special_values(w, g, idx) if idx.size else None
    with np.errstate(invalid="ignore", over="ignore"):
        from_words(w, code, kf, y, g, s.a[: hi - lo], s.b[: hi - lo])
        if y is not out:
            np.copyto(out, y, casting="unsafe")
    finish(code, out, g, idx, values, average)
