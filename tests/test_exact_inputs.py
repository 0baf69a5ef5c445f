"""EXACT_SUM's arguments and values: byte orders, `addends`, averages beyond the range.

The oracle is the exact rational sum of the addends (`fractions.Fraction`), rounded once
to the dtype by NumPy (float64 -> float16 rounds twice only where a tie could move,
which `rounded` avoids by rounding the Fraction itself); a bad argument is a clean
refusal, one line, before any message.
"""

from fractions import Fraction

import numpy as np
import pytest
from helpers.subcomms import on_each_size
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
        if any(not np.isfinite(p[i]) for p in parts):
            continue  # the fixed rules: test_exact.py's special values
        want = exact(parts, i) / (n if average and n > 1 else 1)
        assert float(out[i]) == rounded(want, out.dtype), (i, out[i], want)


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


# ------------------------------------------------------------ `addends` (item 2)


@pytest.mark.parametrize("bad", [2.9, "3", True, None, np.float64(3.0)])
def test_addends_must_be_a_whole_number(bad):
    x = np.ones(4)
    with pytest.raises(TypeError, match="addends must be a whole number"):
        mpidp.allreduce_parts(MPI.COMM_SELF, [x, x, x], np.empty(4), addends=bad)
    with pytest.raises(TypeError, match="addends must be a whole number"):
        mpidp.iallreduce_parts(MPI.COMM_SELF, [x, x, x], np.empty(4), addends=bad)
    with pytest.raises(TypeError, match="addends must be a whole number"):
        mpidp.allreduce_parts_init(MPI.COMM_SELF, [x, x, x], np.empty(4), addends=bad)
    with pytest.raises(TypeError, match="addends must be a whole number"):
        mpidp.reduce_scatter_parts_init(MPI.COMM_SELF, [x, x, x], np.empty(4), [4],
                                        addends=bad, ordered=True)


def test_addends_that_a_rank_can_see_are_wrong_are_refused():
    x = np.ones(4)
    out = np.empty(4)
    with pytest.raises(ValueError, match="this rank holds 3 parts, more than addends=2"):
        mpidp.allreduce_parts(MPI.COMM_SELF, [x, x, x], out, addends=2)
    with pytest.raises(ValueError, match="addends=-1"):
        mpidp.allreduce_parts(MPI.COMM_SELF, [], out, addends=-1)
    # one rank holds every addend: the total is known
    with pytest.raises(ValueError, match="one rank holds all 2 parts, but addends=5"):
        mpidp.allreduce_parts(MPI.COMM_SELF, [x, x], out, addends=5)
    with pytest.raises(ValueError, match="this rank holds 3 parts, more than addends=2"):
        mpidp.ireduce_scatter_parts(MPI.COMM_SELF, [x, x, x], out, [4], addends=2)
    with pytest.raises(TypeError, match=r"counts\[0\] must be a whole number"):
        mpidp.ireduce_scatter_parts(MPI.COMM_SELF, [x], out, [4.0], addends=1)
    mpidp.allreduce_parts(MPI.COMM_SELF, [x, x], out, addends=np.int64(2))
    assert out.tolist() == [2.0] * 4


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_mpi_addends_and_byte_orders(mpi_ranks):
    on_each_size((2, 3), addends_and_byte_orders)


def addends_and_byte_orders(comm):
    """Under MPIDP_DEBUG (on in the suite) every rank refuses parts that do not add up to
    `addends`, naming each rank's count; big-endian addends give the native bits."""
    from mpidp.collectives import checks

    assert checks.debug_enabled(None)
    N, r = comm.Get_size(), comm.Get_rank()
    x = np.full(5, 0.1 * (r + 1))
    out = np.empty(5)
    for addends, mine in ((N, 2), (N + 1, 1)):  # one too many, one too few in all
        named = rf"the ranks hold {mine * N} parts in all \(rank 0: {mine}, rank 1: {mine}"
        with pytest.raises(ValueError, match=rf"{named}.*addends={addends}"):
            mpidp.allreduce_parts(comm, [x] * mine, out, addends=addends)
    mpidp.allreduce_parts(comm, [x] * 2, out, addends=2 * N)  # agreed: still fine
    for dtype in ("float16", ">f2", "float32", "float64"):  # the mean where the sum overflows
        big = np.full(7, np.finfo(dtype).max * 0.9, dtype)
        mean = np.empty_like(big)
        mpidp.allreduce(comm, big, mean, op=mpidp.EXACT_AVG)
        assert mean.tolist() == big.tolist(), dtype
    # plain AVG on float16 sums in float32, then divides and rounds once: MPI's own float32
    # SUM of the same values is the oracle (their sum is exact in float32)
    h = (np.array([60000.0, 1e-3, -65504.0, 0.5, 2.0 ** -24]) * (1 + r % 2)).astype("float16")
    h = np.minimum(h, np.float16(65504))
    wide = np.empty(h.size, np.float32)
    comm.Allreduce(h.astype(np.float32), wide)
    for algorithm in mpidp.ALGORITHMS["allreduce"]:
        got = np.empty_like(h)
        mpidp.allreduce(comm, h, got, op=mpidp.AVG, algorithm=algorithm)
        assert got.tobytes() == (wide / np.float32(N)).astype(np.float16).tobytes(), algorithm
    for order in (">f2", ">f4", ">f8"):
        y = (np.array([1.0, -2.5e-3, 3e3, np.nan, 0.1, 1e-6]) * (r + 1)).astype(order)
        z = np.empty_like(y)
        mpidp.allreduce(comm, y, z, op=mpidp.EXACT_SUM)
        native = y.astype(y.dtype.newbyteorder("="))
        want = np.empty_like(native)
        mpidp.allreduce(comm, native, want, op=mpidp.EXACT_SUM)
        assert z.astype(want.dtype).tobytes() == want.tobytes(), order
        everyone = [(np.array([1.0, -2.5e-3, 3e3, np.nan, 0.1, 1e-6]) * (q + 1)).astype(order)
                    for q in range(N)]
        assert_sum_is_exact(everyone, z)


# ------------------------------------------------------------ averages (item 3)


@pytest.mark.parametrize("dtype, value", [("float16", 60000.0), ("float32", 3e38),
                                          ("float64", 1.5e308), ("float64", 1e308),
                                          (">f2", 60000.0)])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_exact_average_is_representable_where_the_sum_overflows(dtype, value, n):
    """The mean of n equal values is that value, though their sum is beyond the range."""
    x = np.full(3, value, dtype)
    out = np.empty_like(x)
    mpidp.sum_parts([x] * n, out, average=True)
    assert out.tolist() == x.tolist()
    mpidp.sum_parts([x] * n, out)
    assert np.isinf(out).all()  # the sum itself does overflow


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_exact_average_is_the_exact_sum_divided_rounded_once(dtype, n):
    """Against the Fraction oracle: V/n rounded once (addends on one grid, so V = S), also
    where dividing the rounded sum would round twice."""
    rng = np.random.default_rng([n, np.dtype(dtype).itemsize])
    info = np.finfo(dtype)
    for trial in range(20):
        scale = float(info.max) / 4 if trial % 4 == 0 else 1.0
        parts = [(rng.integers(-2 ** (info.nmant + 1), 2 ** (info.nmant + 1), 257)
                  * (scale * 2.0 ** -(info.nmant + 1))).astype(dtype) for _ in range(n)]
        out = np.empty(257, dtype)
        mpidp.sum_parts(parts, out, average=True)
        assert_sum_is_exact(parts, out, average=True)


def test_nearest_rounds_a_fraction_once():
    """The exact fallback of the mean: a float64 midpoint of float32 is moved to the side of
    the exact value (rounding through float64 would round twice), and the range's end."""
    from mpidp.collectives.algorithms.averaging import nearest

    m = Fraction(1) + Fraction(1, 2 ** 24)  # halfway between 1 and 1 + 2^-23 (float32)
    tiny = Fraction(1, 2 ** 80)
    assert nearest(m + tiny, np.float32) == 1 + 2 ** -23
    assert nearest(m - tiny, np.float32) == 1.0
    assert nearest(m, np.float32) == 1.0  # a true tie: to even
    assert np.float32(float(m + tiny)) == 1.0  # what rounding twice gives
    top = Fraction(float(np.finfo(np.float16).max)) + Fraction(2 ** 4)  # 65504 + ulp/2
    assert nearest(top - tiny, np.float16) == 65504.0
    assert nearest(top, np.float16) == float("inf")
    assert nearest(Fraction(10) ** 400, np.float64) == float("inf")
    assert nearest(-Fraction(1, 3), np.float64) == -1 / 3


@pytest.mark.parametrize("dtype", ["<f2", ">f2", "<f4", ">f4"])
@pytest.mark.parametrize("n", [2, 3, 4, 8, 24])
def test_one_word_mean_is_rounded_once_at_midpoints_ties_and_the_ends(dtype, n):
    """`averaging.mean` with one word (float16, float32) against the oracle, on sums W1
    made to land on the dtype's midpoints: q = W1/n a midpoint that is not the mean
    (rounding twice would err), a true tie (to even), next to them, subnormal results,
    and the range's end (max, the overflow threshold); plus random sums."""
    from mpidp.collectives.algorithms.averaging import mean

    dt = np.dtype(dtype)
    info = np.finfo(dt)
    rng = np.random.default_rng([n, dt.itemsize])
    a = (rng.integers(1, 2 ** (info.nmant + 1), 64) * 2.0 ** -info.nmant).astype(dt)
    a = a.astype(np.float64) * 2.0 ** rng.integers(-4, 5, 64)
    mid = a + np.spacing(a.astype(dt)).astype(np.float64) / 2  # midpoints of the dtype
    tiny, big = float(info.tiny), float(info.max)
    top = big + (big - float(np.nextafter(info.max, dt.type(0)))) / 2  # the overflow threshold
    ends = np.array([tiny / 3, tiny * 0.75, -tiny / 5, float(info.smallest_subnormal) / 2,
                     big, top, -top, big * 0.999])
    w1 = np.concatenate([
        mid * n,  # q a true tie
        np.nextafter(mid * n, np.inf), np.nextafter(mid * n, -np.inf),  # near a tie
        -mid * n, ends * n, np.nextafter(ends * n, np.inf),
        rng.standard_normal(300) * 2.0 ** rng.integers(-20, 20, 300), [0.0, -0.0]])
    out = np.empty(w1.size, dt)
    mean(w1, None, out, n, lambda i: Fraction(float(w1[i])))
    for i, w in enumerate(w1):
        want = rounded(Fraction(float(w)) / n, dt)
        assert float(out[i]) == want, (i, float(w), n, float(out[i]), want)


# ------------------------------------------------------------ property tests (item 12)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SPECIAL = (0.0, -0.0, np.inf, -np.inf, np.nan)


def fixed_rules(column):
    """The result the fixed rules give an item with a special addend, or None."""
    if any(np.isnan(v) for v in column) or (np.inf in column and -np.inf in column):
        return np.nan
    if np.inf in column or -np.inf in column:
        return np.inf if np.inf in column else -np.inf
    return None


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_property_exact_sum_and_mean_are_the_oracle_rounded_once(data):
    """Random dtype (both byte orders), 1-7 addends of 0-4 items, values on a common grid
    of 20 + p bits (so that the pre-rounded sum V is the exact sum S), signed zeros, inf
    and nan: EXACT_SUM is S rounded once, EXACT_AVG S/n rounded once, the fixed rules."""
    order = data.draw(st.sampled_from(ORDERS))
    dt = np.dtype(order)
    info = np.finfo(dt)
    p = info.nmant + 1
    n, size = data.draw(st.integers(1, 7)), data.draw(st.integers(0, 4))
    low = data.draw(st.integers(int(info.minexp) - p, int(info.maxexp) - p - 20))
    value = st.one_of(st.builds(lambda m, j: m * 2.0 ** (low + j),
                                st.integers(-(2 ** p - 1), 2 ** p - 1), st.integers(0, 20)),
                      st.sampled_from(SPECIAL))
    parts = [np.array([data.draw(value) for _ in range(size)], dtype=np.float64).astype(order)
             for _ in range(n)]
    for average in (False, True):
        out = np.full(size, 7, order)
        mpidp.sum_parts(parts, out, average=average)
        for i in range(size):
            column = [float(x[i]) for x in parts]
            special = fixed_rules(column)
            got = float(out[i])
            if special is not None:
                assert got == special or (np.isnan(special) and np.isnan(got)), (column, got)
                continue
            want = exact(parts, i) / (n if average and n > 1 else 1)
            assert got == rounded(want, dt), (order, column, average, got)
            if got == 0:  # +0.0 unless every addend is -0.0 (or the mean rounds to -0)
                negative = want < 0 or all(np.signbit(v) and v == 0 for v in column)
                assert bool(np.signbit(out[i])) == negative, (column, average)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-3, 9), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3),
                 st.none()), st.integers(0, 4))
def test_property_addends_is_a_whole_number_matching_the_parts(addends, held):
    """On one rank `addends` must be the number of parts, as an integer: anything else is a
    TypeError or ValueError before any message, and the right one gives sum_parts' bits."""
    x = [np.full(3, 0.1 * (i + 1)) for i in range(held)]
    out = np.full(3, 7.0)
    if type(addends) is int and addends == held:
        mpidp.allreduce_parts(MPI.COMM_SELF, x, out, addends=addends)
        want = np.empty(3)
        mpidp.sum_parts(x, want)
        assert out.tobytes() == want.tobytes()
    else:
        with pytest.raises((TypeError, ValueError)):
            mpidp.allreduce_parts(MPI.COMM_SELF, x, out, addends=addends)
        assert (out == 7.0).all()  # refused before anything was written


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_sim_exact_average_equals_one_rank(dtype):
    """N = 1..6 simulated ranks, every all-reduce algorithm: EXACT_AVG's bits are one
    rank's (`sum_parts(average=True)`), near the range's end too."""
    from mpidp.collectives.algorithms import REGISTRY
    from mpidp.sim.exact import simulate_exact

    rng = np.random.default_rng(3)
    top = float(np.finfo(dtype).max)
    for N in range(1, 7):
        parts = [(rng.uniform(0.5, 1.0, 9) * top * rng.choice([-1, 1], 9)).astype(dtype)
                 for _ in range(N)]
        want = np.empty(9, dtype)
        mpidp.sum_parts(parts, want, average=True)
        assert np.isfinite(want).all()
        for algorithm in REGISTRY["allreduce"]:
            results, _ = simulate_exact(algorithm, [[p] for p in parts], N, average=True)
            assert all(r.tobytes() == want.tobytes() for r in results), (N, algorithm)


@pytest.mark.parametrize("order", (">f8", ">f4", ">f2"))
def test_direct_path_on_big_endian_parts_equals_native(order, monkeypatch):
    """2 and 3 simulated ranks, 3 addends: the direct path's chunks without a code per item
    (`near_sum`, which reads the parts' bits in their own byte order) give native bits."""
    from mpidp.collectives import exact_steps
    from mpidp.sim.exact import simulate_exact

    taken = []
    near = exact_steps.near_sum
    monkeypatch.setattr(exact_steps, "near_sum", lambda *a: taken.append(near(*a)) or taken[-1])
    rng = np.random.default_rng(8)
    parts = [rng.standard_normal(64) * 2.0 ** rng.integers(-8, 8, 64) for _ in range(3)]
    for p in parts:
        p[:3] = [0.0, -0.0, -0.0]
    native = [p.astype(np.dtype(order).newbyteorder("=")) for p in parts]
    big = [p.astype(order) for p in parts]
    got, _ = simulate_exact("ring", [big[:2], big[2:]], 3)
    assert taken and all(taken)
    want, _ = simulate_exact("ring", [native[:2], native[2:]], 3)
    assert all(g.dtype == np.dtype(order) and g.tobytes() == want[0].astype(order).tobytes()
               for g in got)
    assert_sum_is_exact(native, want[0])
    assert np.signbit(want[0][1]) and not np.signbit(want[0][0])
    taken.clear()  # 3 ranks, a part each: blocks of 22, 21, 21 items
    got, _ = simulate_exact("ring", [[p] for p in big], 3)
    assert taken and all(taken)
    assert all(g.tobytes() == want[0].astype(order).tobytes() for g in got)
