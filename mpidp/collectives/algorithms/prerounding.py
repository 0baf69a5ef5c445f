"""EXACT_SUM and EXACT_AVG: a sum whose bits depend only on the addends, as a multiset.

Float addition is not associative: (1e16 + 1) - 1e16 is 0.0, (1e16 - 1e16) + 1 is
1.0, so a ring, a halving tree and one rank summing the same numbers disagree in
the last bits. Pre-rounding (Demmel and Nguyen, "Fast reproducible floating-point
summation", ARITH 2013; "Parallel reproducible summation", IEEE TC 2015;
ReproBLAS) makes the sum independent of the order: agree on a grid per item,
round every addend to it, add the rounded addends where addition is exact (and so
associative), round once at the end. Three passes, two of them collectives:

    1. MAX all-reduce of a code per item (2 bytes for float64, 1 for float32 and
       float16): its largest biased exponent, so |x| < 2^e for every addend; the
       code of inf/nan if any addend is one; 0 if every addend is -0.0 (or a
       negative subnormal).
    2. every rank cuts each addend into words on the grid of e, with magic
       constants m1 = 1.5·2^(e-B1+52), m2 = m1·2^-B2, whose ulps are the grids:

           bit    e-1                          e-B1                   e-B1-B2
                   |<-------- word 1 --------->|<------- word 2 ------->|
           x_a     +-----------------------------------+
           x_b                 +-------------------------------------------+...
           x_c     +-------+                                       (cut: rounded)
                   q1 = fl(x + m1) - m1        q2 = fl((x - q1) + m2) - m2

       Every q1 is a multiple of 2^(e-B1) below 2^e, every q2 a multiple of
       2^(e-B1-B2) below 2^(e-B1), both exact in float64, and both sums of n of
       them stay below 2^53 steps of their grid (B1 = min(51, 53 - k), B2 =
       min(52, 54 - k), k = ceil(log2 n)): any order of float64 additions of them
       is exact, so the SUM all-reduce of the words with any algorithm gives the
       same W1, W2 on every rank. float32 and float16 need word 1 only.
    3. out = fl(W1 + W2): W1 + W2 is the sum V of the rounded addends, exactly,
       and this is its only rounding (float32, float16: float32(W1)).

So an item depends only on its own addends and their number n (``addends``),
never on the rank count, the algorithm, where the addends are or the rest of the
buffer. Two addends (n <= 2) need no grid: one addition, a + b == b + a in IEEE
arithmetic, with -0.0 (the exact identity) from ranks that hold none: plain SUM.
float64 items near the overflow or tiny (e outside ``FAST``) take the same grid
with the words scaled by 2^-e, so that the magic constants stay normal floats.

Error bound. S the exact sum, R the result, u = 2^-p the unit roundoff (p = 53,
24, 11), h the last word's grid step. Rounding each addend to the grid loses at
most h/2; V is exact; one rounding to nearest costs at most u/(1+u)·|V|:

    |R - S| <= u/(1+u)·|S| + (1+u)·n·h/2          (n <= 2: R = fl(S))

Pairwise summation's bound is γ_k·Σ|x_i|, γ_k = ku/(1-ku) (Higham, "Accuracy and
Stability of Numerical Algorithms", §4.2). As Σ|x_i| >= 2^(e-1), the second term
fits into γ_k·Σ|x_i| - u/(1+u)·Σ|x_i| for n up to `most_addends` (2^19 float64,
2^16 float32, 2^23 float16; `grids._fits` checks it in rationals); more are refused.
One addend is itself; subnormal sums are exact where the grid reaches them.

Special values, by fixed rules: a NaN addend gives the canonical quiet NaN, +inf
with -inf gives NaN, else an infinite addend gives that infinity (the words of
such an item count +inf and -inf addends, NaN counting as both); an exact zero
is +0.0 unless every addend is -0.0; a finite sum beyond the range is ±inf.
Integer dtypes take plain SUM (already exact). EXACT_AVG: V/n rounded once
(`averaging`), so a mean is finite where the sum overflows.

Cost (G bytes of float64 on N ranks; A(X) the chosen algorithm's cost for X bytes).
The call path takes one of two exchanges (collectives/exact.py), the same bits:

    direct, 3 <= n <= 3N, N >= 2:
                      one round of raw blocks, h·G(N-1)/N for h addends a rank
                      [+ the parts' counts, 8 B to each peer], then the all-gather
                      of the sums: A_gather(G); with one addend a rank, SUM's bytes
    words,  n > 3N:   A(G/4) [codes, MAX] + A(2G) [words, SUM]     2.25 x SUM's bytes
    n <= 2:           A(G)                                          SUM's
    float32: the words' A(G/4) + A(2G); float16: A(G/2) + A(4G)

plus, per addend, its bits shifted, a maximum and a minimum for the codes, five
passes for the float64 words (two for float32, float16), the magic constants, one
pass at the end. A chunk whose addends lie on their last grid (`on_grid`: within
2^27 of its largest for float32, 2^50 for float64, n <= 4) skips that rounding: one
pass per addend for float32 (no constants), three for float64. The direct path does
this for its own block, a chunk (`exact_direct.CHUNK` bytes of each addend) at a
time, so that the passes run in the cache, with no code per item where the chunk's
extent allows (`exact_steps.near_sum`); the words path walks such chunks too.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .grids import Grid, grid, most_addends  # noqa: F401 (the grid: prerounding's names too)

FAST = (-960, 960)  # float64 items whose e lies here take the magic constants (see above)


# ------------------------------------------------------------ step 1: the code of each item


def max_codes(parts, out, top, other, least: bool = False) -> int | None:
    """out = each item's largest code over `parts` (0, MAX's identity, if there are none).

    A code is the biased exponent (every bit set: inf or nan), so the largest is that of
    the largest bits below the sign: each addend read as unsigned integers of its
    width, shifted left once (the sign dropped; contiguous, vectorized passes), their
    maximum taken, then the mantissa shifted out once. Zeros and subnormals (exponent
    0) code 1 if any of the item's addends has no sign bit, else 0 (only -0.0 and
    negative subnormals, whose sum is zero only if all are -0.0): looked up for those
    items alone. `top`, `other`: scratch of at least out.size items of the
    addends' width each (any dtype; `other` unused for one addend unless `least`).

    With `least`, also returns the smallest code of a nonzero addend (one pass more
    per addend: the shifted bits less one, so that a zero wraps to the largest, and
    their minimum), or a code above every exponent's if all are zero (`on_grid`)."""
    if not parts:
        out[...] = 0
        return 1 << 16 if least else None
    dtype = parts[0].dtype
    wide = np.dtype(f"u{dtype.itemsize}").newbyteorder(dtype.byteorder)  # x's own order
    top = top.view(np.uint8)[: out.size * dtype.itemsize].view(wide)
    if len(parts) > 1 or least:
        other = other.view(np.uint8)[: out.size * dtype.itemsize].view(wide)
    shift = np.finfo(dtype).nmant + 1
    np.left_shift(parts[0].view(wide), 1, out=top)
    low = _least(top, other) if least else None
    for x in parts[1:]:
        np.left_shift(x.view(wide), 1, out=other)
        np.maximum(top, other, out=top)
        if least:
            low = min(low, _least(other, other))
    np.right_shift(top, shift, out=top)  # the biased exponent
    small = np.flatnonzero(top == 0)
    if small.size:  # every addend zero or subnormal: 1 if one is positive (+0.0 included)
        positive = np.zeros(small.size, bool)
        for x in parts:
            positive |= ~np.signbit(x[small])
        top[small] = positive
    np.copyto(out, top, casting="unsafe")
    return None if low is None else (low + 1) >> shift


def _least(shifted, scratch) -> int:
    """The smallest nonzero of `shifted` (an addend's bits shifted left once) less one,
    as a Python int; 2^w - 1 if every item is zero (0 - 1 wraps round)."""
    np.subtract(shifted, 1, out=scratch)
    return int(scratch.min()) if scratch.size else (1 << 8 * scratch.itemsize) - 1


def on_grid(g: Grid, c: int, low: int) -> bool:
    """True if every addend of these items, whose largest code is `c` and smallest nonzero
    one `low` (from `max_codes`), lies on its item's last grid already: then rounding it
    there changes nothing (`to_words`' `fast`: one word is x, two words are q1 and x - q1
    as it is).

    x's last bit is 2^(max(c_x, 1) - bias - nmant), an item's last grid step
    2^(e - B1 - B2) with e = max(c, 1) - bias + 1, so x lies on it where max(c, 1) -
    max(c_x, 1) <= B1 + B2 - nmant - 1 for c the item's code (float32 up to 4 addends:
    27 bits; float64: 50). The words' sums stay exact as before (every partial sum a
    multiple of the grid step below 2^53 of them). Items with inf or nan (the top code)
    take the rounding; scaled ones (`extremes`) are made apart anyway."""
    room = g.B1 + g.B2 - np.finfo(g.dtype).nmant - 1
    return c < g.top and max(c, 1) - max(low, 1) <= room


# ------------------------------------------------------------ step 2: the words


def _range(g: Grid) -> tuple[int, int]:
    """The codes the magic constants serve: float64 those whose e lies in `FAST`."""
    if g.words == 2:
        return FAST[0] + g.bias - 1, FAST[1] + g.bias - 1
    return 1, g.top - 1


@cache
def magic_tables(g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """m1 and m2 for every code: 1.5·2^(e-B1+52) and that times 2^-B2 (codes outside
    `_range` get their nearest's: their words are made apart, in `extremes`)."""
    lo, hi = _range(g)
    e = np.clip(np.arange(g.top + 1), lo, hi) - (g.bias - 1)
    m1 = np.ldexp(1.5, e - g.B1 + 52)
    return m1, m1 * 2.0 ** -g.B2


def magics(code, g: Grid, m1, m2, tmp) -> np.ndarray:
    """m1, m2 per item from the agreed codes (the values of `magic_tables`), made as
    their 16 high bits (sign 0, exponent, mantissa 1.5: 0b1000) shifted over zeros;
    returns the float64 items outside `FAST`, whose words `extremes` makes."""
    lo, hi = _range(g)
    t16 = tmp.view(np.uint16)[: code.size]
    inside = not code.size or lo <= code.min() and code.max() <= hi  # (mostly: no clip)
    if inside:
        np.copyto(t16, code, casting="unsafe")
    else:
        np.clip(code, lo, hi, out=t16, casting="unsafe")
    np.add(t16, 1076 - g.bias - g.B1, out=t16)  # m1's biased exponent: e - B1 + 52 + 1023
    np.left_shift(t16, 4, out=t16)
    np.bitwise_or(t16, 0b1000, out=t16)
    bits = m1.view(np.int64)  # m1's 64 bits: those 16 on top of zeros
    np.copyto(bits, t16, casting="unsafe")
    np.left_shift(bits, 48, out=bits)
    if g.words == 2:  # m2 = m1·2^-B2: B2 less in the exponent
        np.subtract(bits, g.B2 << 52, out=m2.view(np.int64))
    if g.words == 1 or inside:
        return np.zeros(0, np.intp)
    return np.flatnonzero(((code < lo) | (code > hi)) & (code != g.top))


def to_words(x, m1, m2, w1, w2, tmp, first: bool, fast: bool = False) -> None:
    """w1 (+)= x rounded to the grid of m1; w2 (+)= the rest rounded to the grid of m2.

    fl(x + m1) - m1 is x rounded to a multiple of ulp(m1) (|x| < m1/3: the sum stays in
    m1's binade), exactly; x minus it is exact too. All float64 (x: converted on the way).
    `fast`: x lies on the last grid already (`on_grid`), so that rounding is left out:
    one word is x itself, the second the rest as it is.
    """
    if fast and w2 is None:
        if first:
            np.copyto(w1, x, casting="same_kind")
        else:
            np.add(w1, x, out=w1)
        return
    q1 = w1 if first else tmp
    np.add(x, m1, out=q1)
    np.subtract(q1, m1, out=q1)
    if not first:
        np.add(w1, q1, out=w1)
    if w2 is None:
        return
    q2 = w2 if first else tmp
    np.subtract(x, q1, out=q2)  # the rest, |r| <= ulp(m1)/2
    if not fast:
        np.add(q2, m2, out=q2)
        np.subtract(q2, m2, out=q2)
    if not first:
        np.add(w2, q2, out=w2)


def extremes(parts, idx, code, g: Grid, w1, w2) -> None:
    """The float64 items with e outside `FAST` (near the overflow, or tiny): their words
    scaled by 2^-e (exact), the same grids, so sums cannot overflow nor drop to subnormals."""
    e = np.maximum(code[idx], 1).astype(np.int64) - (g.bias - 1)
    m1, m2 = 1.5 * 2.0 ** (52 - g.B1), 1.5 * 2.0 ** (52 - g.B1 - g.B2)
    s1, s2 = np.zeros(idx.size), np.zeros(idx.size)
    for x in parts:
        y = np.ldexp(x[idx], -e)
        q1 = (y + m1) - m1
        s1 += q1
        s2 += ((y - q1) + m2) - m2
    w1[idx], w2[idx] = s1, s2


def specials(parts, code, w1, w2, g: Grid) -> np.ndarray:
    """Items with an inf or nan addend somewhere: their words count +inf and -inf (nan
    counts as both). Returns their indices."""
    idx = np.flatnonzero(code == g.top)
    if idx.size == 0:
        return idx
    plus, minus = np.zeros(idx.size), np.zeros(idx.size)
    for x in parts:
        xs = x[idx]
        nan = np.isnan(xs)
        plus += (xs == np.inf) | nan
        minus += (xs == -np.inf) | nan
    if w2 is not None:
        w1[idx], w2[idx] = plus, minus
    else:
        w1[idx] = plus + minus * float(1 << 24)
    return idx


# ------------------------------------------------------------ step 3: back to floats


def special_values(w1, w2, idx):
    """The results of the special items `idx`, from their summed words: nan, +inf or -inf."""
    if w2 is not None:
        plus, minus = w1[idx] > 0, w2[idx] > 0
    else:
        plus, minus = np.fmod(w1[idx], 1 << 24) > 0, w1[idx] >= (1 << 24)
    return np.where(plus & minus, np.nan, np.where(plus, np.inf, -np.inf))


def from_words(w1, w2, out, code, g: Grid, scaled) -> None:
    """out = the float nearest to the summed words: one rounding of an exact value."""
    if w2 is None:
        np.copyto(out, w1, casting="same_kind")
        return
    np.add(w1, w2, out=out)  # W1 + W2 is V exactly; fl() of it is the only rounding
    if scaled.size:
        e = np.maximum(code[scaled], 1).astype(np.int64) - (g.bias - 1)
        out[scaled] = np.ldexp(w1[scaled] + w2[scaled], e)


def finish(code, out, g: Grid, idx, values) -> None:
    """The fixed rules (nan, inf: `values` at `idx`; -0.0), after the sum or the mean."""
    if idx.size:
        out[idx] = values
    if g.addends:
        neg = np.flatnonzero(code == 0)  # only -0.0 and negative subnormals: zero iff all -0.0
        if neg.size:
            zero = out[neg] == 0
            out[neg[zero]] = -0.0
