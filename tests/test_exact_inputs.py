"""EXACT_SUM's arguments and values: byte orders, `addends`, averages beyond the range.

The oracle is the exact rational sum of the addends (`fractions.Fraction`), rounded once
to the dtype by NumPy (float64 -> float16 rounds twice only where a tie could move,
which `rounded` avoids by rounding the Fraction itself); a bad argument is a clean
refusal, one line, before any message.
"""

from fractions import Fraction

import numpy as np
import pytest
from mpi4py import MPI

import mpidp

ORDERS = (">f2", ">f4", ">f8", "<f2", "<f4", "<f8")


def rounded(value: Fraction, dtype) -> float:
    """The float of `dtype` nearest to `value` (ties to even), inf beyond the range."""
    dt = np.dtype(dtype).newbyteorder("=")
    info = np.finfo(dt)
    if value == 0:
        return 0.0
    sign, value = (-1 if value < 0 else 1), abs(value)
    e = max(value.numerator.bit_length() - value.denominator.bit_length() + 1,
            int(info.minexp) + 1)
    while Fraction(2) ** (e - 1) > value:  # 2^(e-1) <= value < 2^e (or subnormal)
        e -= 1
    while Fraction(2) ** e <= value:
        e += 1
    step = Fraction(2) ** (max(e, int(info.minexp) + 1) - 1 - int(info.nmant))
    q, r = divmod(value, step)
    q = int(q) + (1 if r > step / 2 or (r == step / 2 and q % 2) else 0)
    x = Fraction(q) * step
    if x > Fraction(float(info.max)):
        return sign * float("inf")
    return sign * float(x)


def exact(parts, i) -> Fraction:
    return sum((Fraction(float(p[i])) for p in parts), Fraction(0))


def assert_sum_is_exact(parts, out, average=False):
    n = len(parts)
    for i in range(out.size):
        want = exact(parts, i) / (n if average and n > 1 else 1)
        assert float(out[i]) == rounded(want, out.dtype) or (
            np.isnan(out[i]) and any(np.isnan(p[i]) for p in parts)), (i, out[i], want)


# ------------------------------------------------------------ byte orders (item 1)


@pytest.mark.parametrize("order", ORDERS)
def test_sum_parts_in_either_byte_order_is_the_exact_sum(order):
    rng = np.random.default_rng(7)
    parts = [(rng.standard_normal(64) * 2.0 ** rng.integers(-8, 8, 64)).astype(order)
             for _ in range(5)]
    out = np.empty(64, order)
    mpidp.sum_parts(parts, out)
    assert out.dtype == np.dtype(order)
    assert_sum_is_exact(parts, out)
    native = np.empty(64, np.dtype(order).newbyteorder("="))
    mpidp.sum_parts([p.astype(native.dtype) for p in parts], native)
    assert native.tolist() == out.tolist()


@pytest.mark.parametrize("order", (">f2", ">f4", ">f8"))
def test_exact_allreduce_on_big_endian_equals_native(order):
    """Through the function API (one rank, three addends as parts) and the op."""
    x = np.array([1e-3, -2.5, 3.75, 0.0, -0.0, np.inf], order)
    y, z = np.empty_like(x), np.empty(x.size, x.dtype.newbyteorder("="))
    mpidp.allreduce_parts(MPI.COMM_SELF, [x, x, (-x).astype(order)], y, addends=3)
    mpidp.allreduce_parts(MPI.COMM_SELF, [x.astype(z.dtype)] * 2 + [-x.astype(z.dtype)], z,
                          addends=3)
    assert y.tobytes() == z.astype(y.dtype).tobytes()
    mpidp.allreduce(MPI.COMM_SELF, x, y, op=mpidp.EXACT_SUM)
    assert y.tobytes() == x.tobytes()
