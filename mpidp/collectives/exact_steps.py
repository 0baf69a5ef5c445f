"""The exact sum's three steps on this rank (prerounding.py derives them), and their scratch.

`exact.exact_rounds` runs them around its two collectives (the MAX pass between
`codes` and `cut`, the SUM pass between `cut` and `back`); `local_sum` runs them on
one rank, for the direct path's chunks (exact_direct.py), where a float64 chunk near its
largest addend takes `split_sum` instead of `cut`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .algorithms.averaging import mean
from .algorithms.prerounding import (
    Grid,
    _least,
    _range,
    extremes,
    finish,
    from_words,
    magics,
    max_codes,
    on_grid,
    special_values,
    specials,
    to_words,
)
from .exact_direct import chunk_items


class Scratch(NamedTuple):
    """Pooled arrays of one exact collective of `count` items."""

    code: object  # count, the code dtype (n <= 2: none)
    code_tmp: object  # the MAX algorithm's tmp, code dtype
    tmp16: object  # count, uint16: the magic constants' high bits (`magics`)
    words: object  # count·words of g.word: all-reduce [W1 | W2], reduce-scatter W1 W2 W1 ...
    words_tmp: object  # the SUM algorithm's tmp, word dtype
    m1: object  # count, float64: the magic constants of the two grids (first: the codes' max)
    m2: object
    y: object  # count, float64: a word of the second, third ... part (first: the codes')


def scratch_for(pool, g: Grid, count: int, code_items: int, word_items: int) -> Scratch:
    def take(dt, items):
        return pool.take(np.empty(0, dt), items)

    grid_items = 0 if g.plain else count
    return Scratch(take(g.code, grid_items), take(g.code, 0 if g.plain else code_items),
                   take(np.uint16, grid_items), take(g.word, count * g.words),
                   take(g.word, word_items), take(np.float64, grid_items),
                   take(np.float64, grid_items if g.words == 2 else 0),
                   take(np.float64, grid_items))


def chunks(count: int, dtype):
    """(start, stop) of the chunks (`exact_direct.CHUNK` bytes of dtype) over `count` items."""
    step = max(chunk_items(count, dtype), 1)
    return ((a, min(a + step, count)) for a in range(0, count, step))


def words_of(W, g: Grid, interleaved: bool, lo: int, hi: int):
    """Items lo..hi of word 1 and word 2 (None: one word) as views of W."""
    if g.words == 1:
        return W[lo:hi], None
    if interleaved:
        return W[2 * lo : 2 * hi : 2], W[2 * lo + 1 : 2 * hi : 2]
    count = W.size // 2
    return W[lo:hi], W[count + lo : count + hi]


def local_sum(parts, out, g: Grid, s: Scratch, average: bool = False) -> None:
    """`exact_rounds` on one rank (not `plain`): the direct path's sum of the addends of
    a chunk of its block, the same steps without the collectives or a generator."""
    count = out.size
    if near_sum(parts, g, s, count):
        none = np.zeros(0, np.intp)
        back(s.words, g, False, 0, count, None, out, none, none, average)
        if g.words == 2:  # (one word is the addends' own float64 sum: IEEE's signs hold)
            negative_zeros(parts, out)
        return
    lows = codes(parts, g, s, count)
    scaled, special = cut(parts, g, s, count, False, lows)
    back(s.words, g, False, 0, count, s.code[:count], out, special, scaled, average)


def extent(parts, t) -> tuple[int, int]:
    """(the largest code, the smallest code of a nonzero addend) over all of `parts`, from
    `max_codes`' bits (x shifted left once; less one, so that a zero wraps round) but
    one maximum and one minimum for the whole chunk, no code per item: above every
    exponent's for the smallest if all are zero. `t`: scratch of the parts' size in bytes."""
    dtype = parts[0].dtype
    wide = np.dtype(f"u{dtype.itemsize}")
    t = t.view(np.uint8)[: parts[0].nbytes].view(wide)
    top, least = 0, (1 << 8 * dtype.itemsize) - 1
    for x in parts:
        np.left_shift(x.view(wide.newbyteorder(dtype.byteorder)), 1, out=t)
        top = max(top, int(t.max()))
        least = min(least, _least(t, t))
    shift = np.finfo(dtype).nmant + 1
    return top >> shift, (least + 1) >> shift


def near_sum(parts, g: Grid, s: Scratch, n: int) -> bool:
    """The words of n items whose addends are all on this rank, without a code per item,
    where the chunk's `extent` allows (False, nothing done, where it does not): float64
    near enough its largest addend split at one constant (`split_sum`); float32 and
    float16 on their last grid (`on_grid`) summed in float64 as they are (`to_words`'
    `fast`). No inf nor nan (they code `top`). An exact zero's sign: one word is the
    addends' exact sum in IEEE arithmetic, -0.0 only where every addend is, as the fixed
    rule says; two words lose it (S - M is +0.0), and `negative_zeros` puts it back."""
    if g.plain or not parts or not n:
        return False
    c, low = extent(parts, s.y[:n])
    if g.words == 2:
        return split_sum(parts, g, s, n, c, low)
    if not on_grid(g, c, low):  # (inf and nan code `top`: not on it)
        return False
    for i, x in enumerate(parts):
        to_words(x, None, None, s.words[:n], None, None, i == 0, True)
    return True


def split_sum(parts, g: Grid, s: Scratch, n: int, c: int, low: int) -> bool:
    """Two words where every addend of these n items is on this rank and near enough the
    largest code `c` (`low` the smallest nonzero one, from `extent`): [W1 | W2] in s.words
    with W1 + W2 = V, the addends' exact sum, split at one constant for the chunk instead
    of each item's (no code per item, no magic constants). False (nothing done) where the
    bound below does not hold, or an addend is inf, nan, subnormal or outside `FAST`.

    With |x| < 2^E for every addend (E from the largest code c), n <= 2^k addends and
    M = 1.5·2^(E+k+2), S = M + (the q's so far) stays in M's binade (grid H = 2^(E+k-50)):
    t = fl(S + x), q = t - S (x rounded to H, exact), r = x - q (exact, |r| <= H/2), the
    ties whichever way, as the sum S + r = S_before + x is exact whatever q is. The r's are
    multiples of the smallest addend's last bit 2^(max(low, 1) - bias - 52), and n of
    them stay below 2^53 such bits where c - max(low, 1) <= 51 - 2k: then W2 = Σ r is
    exact in any order, W1 = S - M too, and every addend is on its item's last grid
    (`on_grid`'s room is larger), so fl(W1 + W2) is the grid's sum, bit for bit."""
    k = (g.addends - 1).bit_length()
    lo, hi = _range(g)
    if not (c <= hi and max(low, 1) >= lo and c - max(low, 1) <= 51 - 2 * k):
        return False
    M = float(np.ldexp(1.5, c - g.bias + 1 + k + 2))
    w1, w2, S, T = s.words[:n], s.words[n : 2 * n], s.m1[:n], s.m2[:n]
    np.add(parts[0], M, out=S)
    np.subtract(S, M, out=T)  # q
    np.subtract(parts[0], T, out=w2)  # r
    for x in parts[1:]:
        np.add(S, x, out=T)  # t
        np.subtract(T, S, out=S)  # q (S is free once t is made)
        np.subtract(x, S, out=S)  # r
        np.add(w2, S, out=w2)
        S, T = T, S
    np.subtract(S, M, out=w1)
    return True


def negative_zeros(parts, out) -> None:
    """The fixed rule where no code per item was made (`split_sum`): an exact zero is -0.0
    where every addend is (a zero sum of addends with the sign bit is theirs alone)."""
    zero = np.flatnonzero(out == 0)
    if zero.size:
        neg = np.ones(zero.size, bool)
        for x in parts:
            neg &= np.signbit(x[zero])
        out[zero[neg]] = -0.0


def codes(parts, g: Grid, s: Scratch, count: int) -> list:
    """Step 1 on this rank: s.code = each item's largest code over `parts`. Returns per
    chunk the smallest code of this rank's nonzero addends, for `cut` to see where they
    lie on the grid already (`on_grid`)."""
    lows = []
    for a, b in chunks(count, g.dtype):  # a chunk of every addend at a time, in the cache
        lows.append(max_codes([x[a:b] for x in parts], s.code[a:b], s.m1[a:b],
                              s.y[: b - a], True))
    return lows


def cut(parts, g: Grid, s: Scratch, count: int, interleaved: bool, lows: list):
    """Step 2 on the agreed codes: the words of this rank's addends, in s.words. Returns
    the items whose words are scaled (`extremes`) and the special ones (`specials`).

    A chunk whose addends all lie on their last grid already (`lows`, from `codes`:
    `on_grid`) skips that rounding: one word is then the addends' own sum in float64,
    the second word their rests' (`to_words`), the same numbers."""
    code, W = s.code[:count], s.words
    w1, w2 = words_of(W, g, interleaved, 0, count)
    one = g.words == 1
    m2 = None if one else s.m2
    scaled = np.zeros(0, np.intp) if one else magics(code, g, s.m1, m2, s.tmp16)
    if not parts:
        W[...] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        for (a, b), low in zip(chunks(count, g.dtype), lows, strict=True):
            if not parts:
                break
            fast = on_grid(g, int(code[a:b].max()), low)
            if one and not fast:  # (one word: its constants only where they are used)
                magics(code[a:b], g, s.m1[a:b], None, s.tmp16[a:b])
            for i, x in enumerate(parts):
                to_words(x[a:b], s.m1[a:b], m2 if m2 is None else m2[a:b], w1[a:b],
                         w2 if w2 is None else w2[a:b], s.y[: b - a], i == 0, fast)
        if scaled.size:
            extremes(parts, scaled, code, g, w1, w2)
    return scaled, specials(parts, code, w1, w2, g)


def back(W, g: Grid, interleaved: bool, lo: int, hi: int, code, out, special, scaled,
         average: bool) -> None:
    """Step 3: out = items lo..hi of the summed words (`code`: theirs), one rounding; the
    mean from the words (`averaging`); then the fixed rules (`code` None: a `near_sum`
    chunk, none scaled nor special, whose rule `local_sum` applies)."""
    w1, w2 = words_of(W, g, interleaved, lo, hi)
    values = special_values(w1, w2, special) if special.size else None
    if average and g.addends > 1:  # V/n from the words, rounded once (averaging.py)
        mean(w1, w2, out, g.addends, lambda i: _exact(w1, w2, code, g, i), scaled)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            from_words(w1, w2, out, code, g, scaled)
    if code is not None:
        finish(code, out, g, special, values)


def _exact(w1, w2, code, g: Grid, i: int) -> Fraction:
    """Item i's summed words as the exact V (scaled ones times 2^e, as `from_words`)."""
    v = Fraction(float(w1[i])) + (0 if w2 is None else Fraction(float(w2[i])))
    if code is not None and g.words == 2 and not _range(g)[0] <= code[i] <= _range(g)[1]:
        v *= Fraction(2) ** (max(int(code[i]), 1) - (g.bias - 1))
    return v
