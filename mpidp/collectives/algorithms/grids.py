"""The exact sum's grid: what the dtype and the number of addends decide (prerounding.py).

`grid(dtype, addends)` gives the bits of the two words each item is pre-rounded to
(B1, B2), chosen so that the words' sums over the addends stay exact in float64 and
the rounding error stays within the bound prerounding.py's docstring derives
(`most_addends`: how many addends it holds for).
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache, lru_cache
from typing import NamedTuple

import numpy as np


class Grid(NamedTuple):
    """What the dtype and the number of addends n decide."""

    dtype: np.dtype  # the addends'
    code: np.dtype  # the pre-pass code: the biased exponent (uint16, uint8)
    word: np.dtype  # float64, or (n <= 2) the dtype itself
    words: int  # words per item: 2 (float64), 1
    B1: int  # bits of word 1: its grid is 2^(e-B1)
    B2: int  # bits of word 2: its grid is 2^(e-B1-B2) (0: one word)
    top: int  # the code of inf and nan: every exponent bit set
    bias: int  # exponent bias (1023, 127, 15)
    addends: int
    plain: bool  # n <= 2: one rounded addition, the same in any order (see the docstring)


def _fits(dtype, n: int, bits: int) -> bool:
    """Does (1+u)·n·h/2 fit into γ_k·Σ|x| - u/(1+u)·Σ|x|, h = 2^(e-bits), Σ|x| >= 2^(e-1)?"""
    u = Fraction(1, 2 ** (np.finfo(dtype).nmant + 1))
    k = (n - 1).bit_length()
    if k * u >= 1:
        return False
    room = k * u / (1 - k * u) - u / (1 + u)
    return (1 + u) * n * Fraction(1, 2 ** (bits + 1)) <= room / 2


def _bits(dtype, k: int) -> tuple[int, int]:
    """B1, B2 for n addends, k = ceil(log2 n) >= 2: the words' sums stay below 2^53 grid
    steps (exact in float64), and |x| < m1/3 for the magic constants (B1 <= 51, B2 <= 52)."""
    return min(51, 53 - k), min(52, 54 - k) if dtype == np.float64 else 0


@cache
def most_addends(name: str) -> int:
    """The most addends (a power of two) for which every n >= 3 up to it meets the bound
    (the worst n for each k = ceil(log2 n) is 2^k)."""
    k = 2
    while _fits(np.dtype(name), 2 ** (k + 1), sum(_bits(np.dtype(name), k + 1))):
        k += 1
    return 2 ** k


@lru_cache(maxsize=256)  # (a Grid is immutable; every exact call asks for its grid)
def grid(dtype, addends: int, average: bool = False) -> Grid:
    """The grid for `addends` addends of `dtype` (float16, float32 or float64, in either
    byte order: the grid is the native dtype's, its float64 words native; n <= 2 adds the
    addends themselves, in their own byte order).

    `average` (EXACT_AVG) of two addends: float16 and float32 add them in float64 (their
    sum is exact there, halving it too: one rounding, no overflow), float64 on the grid
    (its mean from the words, `averaging`), so that a mean is never an overflowed sum."""
    given = np.dtype(dtype)
    dtype = given.newbyteorder("=")
    if dtype.name not in ("float64", "float32", "float16"):
        raise TypeError(f"exact sum of {dtype}: only float16, float32 and float64 "
                        "(integers take SUM)")
    n = int(addends)
    k = max(n - 1, 0).bit_length()  # ceil(log2 n)
    info = np.finfo(dtype)
    bias, top = info.maxexp - 1, 2 * info.maxexp - 1
    code = np.dtype(np.uint16 if dtype == np.float64 else np.uint8)
    if n < 0:
        raise ValueError(f"exact sum of {n} addends")
    if n <= 2 and not (average and n == 2 and dtype == np.float64):
        wide = average and n == 2  # float16, float32: summed and halved in float64
        return Grid(dtype, code, np.dtype(np.float64) if wide else given, 1, 0, 0, top, bias,
                    n, True)
    B1, B2 = _bits(dtype, max(k, 2))
    if n > most_addends(dtype.name):
        raise ValueError(f"exact sum of {n} addends of {dtype}: the error bound holds for "
                         f"up to {most_addends(dtype.name)} addends")
    return Grid(dtype, code, np.dtype(np.float64), 2 if B2 else 1, B1, B2, top, bias, n, False)
