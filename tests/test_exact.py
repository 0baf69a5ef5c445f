"""EXACT_SUM / EXACT_AVG: order independence, the error bound, the fixed rules, the bytes.

The oracles: the exact rational sum (`fractions.Fraction`, and `math.fsum`, which
rounds it correctly) for accuracy; for order independence, the one-rank exact sum
of the same addends, which every rank of every algorithm must equal bitwise
(simulated for N = 1..16 here, ``python -m mpidp.sim check all --exact`` for
1..64); under MPI, the same, and the MPI library's own SUM within its bound.
"""

import math
import sys
from fractions import Fraction

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives import cost
from mpidp.collectives.algorithms import REGISTRY, prerounding
from mpidp.collectives.dropin.counting import CountingComm
from mpidp.collectives.engine.staging import ScratchPool
from mpidp.sim import exact as sim_exact
from mpidp.sim.exact import check_exact, hard_addends, simulate_exact

FLOATS = (np.float64, np.float32, np.float16)


def exact_sum(parts, i) -> Fraction:
    return sum((Fraction(float(p[i])) for p in parts), Fraction(0))


def pairwise_bound(parts, i, dtype) -> Fraction:
    """γ_k·Σ|x|, k = ceil(log2 n): pairwise summation's error bound (Higham §4.2)."""
    n = len(parts)
    if n == 1:
        return Fraction(0)
    u = Fraction(1, 2 ** (np.finfo(dtype).nmant + 1))
    k = (n - 1).bit_length()
    return k * u / (1 - k * u) * sum(abs(Fraction(float(p[i]))) for p in parts)


def local(parts, dtype=None):
    out = np.empty(parts[0].size, dtype or parts[0].dtype)
    mpidp.sum_parts(parts, out)
    return out


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def finite_hard(count, n, dtype, seed):
    """Hard addends without inf/nan: cancellations, the whole range, subnormals, zeros."""
    parts = hard_addends(count, n, dtype, seed)
    for p in parts:
        p[~np.isfinite(p)] = 0
    return parts


# ------------------------------------------------------------ accuracy


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64])
def test_error_within_pairwise_bound(dtype, n):
    """|R - S| <= γ_k Σ|x| on hard addends; the result never worse than 1/2 ulp plus the grid."""
    with np.errstate(over="ignore"):
        parts = finite_hard(120, n, dtype, seed=n)
        if n >= 2:  # the hardest case for the bound: same signs, no cancellation at all
            parts[1][:20] = parts[0][:20]
        got = local(parts)
    info = np.finfo(dtype)
    for i in range(got.size):
        S = exact_sum(parts, i)
        if abs(S) > Fraction(float(info.max)):  # beyond the range (only huge addends)
            continue
        err = abs(Fraction(float(got[i])) - S)
        assert err <= pairwise_bound(parts, i, dtype), (i, [float(p[i]) for p in parts])


def test_float64_is_correctly_rounded_where_the_grid_holds_every_bit():
    """Addends within 2^36 of each other: every bit lies on the grid (B1 + B2 = 107 - 2k >=
    36 + 53 for n <= 64), so V = S and the result is fsum's, the correctly rounded sum."""
    rng = np.random.default_rng(1)
    for n in (3, 8, 64):
        g = prerounding.grid(np.float64, n)
        assert g.B1 + g.B2 >= 36 + 53 + 1
        parts = [rng.choice([-1.0, 1.0], 500) * rng.uniform(1, 2, 500)
                 * np.exp2(rng.integers(-30, 6, 500)) for _ in range(n)]
        parts[1][:100] = -parts[0][:100]  # exact cancellation of the largest, for some items
        got = local(parts)
        want = np.array([math.fsum(p[i] for p in parts) for i in range(500)])
        assert same_bits(got, want), np.flatnonzero(got != want)[:5]


def test_one_addend_is_itself():
    """One addend comes back bit for bit (-0.0, subnormals, ±max, inf), NaN as the canonical NaN."""
    for dtype in FLOATS:
        x = hard_addends(300, 2, dtype)[0]
        x[:3] = [np.nan, -np.inf, -0.0]
        want = np.where(np.isnan(x), np.array(np.nan, dtype), x)
        assert same_bits(local([x]), want)


def test_subnormals_sum_exactly():
    for dtype in FLOATS:
        tiny = np.finfo(dtype).smallest_subnormal
        rng = np.random.default_rng(2)
        parts = [(rng.integers(-1000, 1000, 200) * tiny).astype(dtype) for _ in range(7)]
        got = local(parts)
        want = np.sum(np.stack(parts).astype(np.float64), axis=0).astype(dtype)  # exact here
        assert np.array_equal(got, want)


# ------------------------------------------------------------ the fixed rules


INF, NAN = np.inf, np.nan
RULES = [  # addends, result ("nan", "+0", "-0" or a number)
    ([NAN, 1.0], "nan"), ([1.0, -NAN], "nan"), ([INF, -INF], "nan"), ([INF, NAN], "nan"),
    ([INF, 1.0, INF], INF), ([-INF, 5.0], -INF), ([-0.0, -0.0], "-0"), ([-0.0], "-0"),
    ([-0.0, 0.0], "+0"), ([1.0, -1.0], "+0"), ([-1.0, 1.0, -0.0], "+0"), ([0.0], "+0"),
    (["max", "max"], INF), (["-max", "-max", 1.0], -INF), (["max", "max", "-max"], "max"),
    (["-tiny", "tiny"], "+0"), (["-tiny", -0.0], "-tiny"),
    # three addends and more take the grid: the same rules
    ([NAN, 1.0, 2.0], "nan"), ([1.0, 2.0, -NAN, 3.0], "nan"), ([INF, -INF, 1.0], "nan"),
    ([INF, 1.0, 2.0], INF), ([-INF, 1.0, -INF], -INF), ([-0.0, -0.0, -0.0], "-0"),
    ([-0.0, 0.0, -0.0], "+0"), ([1.0, -1.0, -0.0], "+0"), ([-0.0, -0.0, -0.0, 0.0], "+0"),
    (["max", "max", 1.0], INF), (["-max", "-max", "-max"], -INF),
    (["max", "max", "-max", 0.0], "max"), (["-tiny", "tiny", -0.0], "+0"),
    (["-tiny", -0.0, -0.0], "-tiny"),
]


def _value(a, dtype):
    info = np.finfo(dtype)
    names = {"max": info.max, "-max": -info.max, "tiny": info.smallest_subnormal,
             "-tiny": -info.smallest_subnormal}
    return np.array(names.get(a, a) if isinstance(a, str) else a, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_special_values_follow_fixed_rules_in_every_order(dtype):
    rng = np.random.default_rng(3)
    for addends, want in RULES:
        vals = [_value(a, dtype) for a in addends]
        w = want if want in ("nan", "+0", "-0") else _value(want, dtype)
        for _trial in range(4):  # orders, and beside other items of the buffer
            order = rng.permutation(len(vals))
            parts = [np.array([rng.standard_normal(), vals[j], 3.0], dtype) for j in order]
            with np.errstate(over="ignore", invalid="ignore"):
                got = local(parts)[1]
            if w == "nan":
                assert np.array(got).tobytes() == np.array(np.nan, dtype).tobytes(), addends
            elif w in ("+0", "-0"):
                assert got == 0 and np.signbit(got) == (w == "-0"), (addends, got)
            else:
                assert np.array(got).tobytes() == w.tobytes(), (addends, got, w)


def test_average_and_integers():
    x = [np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 5.0])]
    out = np.empty(3)
    mpidp.sum_parts(x, out, average=True)
    assert out.tolist() == [1.5, 2.0, 4.5]
    assert mpidp.resolve_op("exact_sum") is mpidp.EXACT_SUM
    assert mpidp.resolve_op("EXACT_AVG") is mpidp.EXACT_AVG


def test_refuses_what_the_bound_does_not_cover():
    with pytest.raises(ValueError, match="up to 65536 addends"):
        prerounding.grid(np.float32, 2 ** 16 + 1)
    prerounding.grid(np.float32, 2 ** 16)
    with pytest.raises(TypeError, match="float16, float32 and float64"):
        prerounding.grid(np.complex128, 2)
    with pytest.raises(ValueError, match="every part must match"):
        mpidp.sum_parts([np.zeros(3), np.zeros(4)], np.zeros(3))
    with pytest.raises(TypeError, match="op 'exact_avg' is not defined on dtype int64"):
        mpidp.allreduce(MPI.COMM_SELF, np.zeros(3, np.int64), np.zeros(3, np.int64),
                        op=mpidp.EXACT_AVG)


# ------------------------------------------------------------ order independence (simulated)


@pytest.mark.parametrize("collective,algorithm",
                         [("allreduce", a) for a in REGISTRY["allreduce"]] +
                         [("reduce_scatter", a) for a in REGISTRY["reduce_scatter"]])
def test_sim_every_algorithm_bitwise_equals_one_rank(collective, algorithm):
    """N = 1..8, 11, 16: every rank's bits equal one rank's exact sum of the same addends,
    also with more addends than ranks, spread unevenly (one rank holds none)."""
    ok, cases, problem = check_exact(algorithm, collective, [*range(1, 9), 11, 16], quick=True)
    assert ok, problem
    assert cases >= 40


def test_sim_check_fails_for_an_order_dependent_sum(monkeypatch):
    """The check can fail: a plain float sum (the parts added, then a ring SUM) is caught."""
    from mpidp.collectives.algorithms.blocks import Blocks
    from mpidp.collectives.algorithms.ops import SUM
    from mpidp.collectives.algorithms.ring import ring_allreduce

    def plain(comm, parts, out, g, *args):
        out[...] = 0
        for p in parts:
            out += p
        tmp = np.empty(out.size, out.dtype)
        yield from ring_allreduce(comm, out, Blocks.even(out.size, comm.Get_size()), SUM, tmp)

    monkeypatch.setattr(sim_exact, "exact_rounds", plain)
    with np.errstate(invalid="ignore", over="ignore"):
        ok, _, problem = check_exact("ring", "allreduce", [2, 3, 5])
    assert not ok and "differs from one rank's exact sum" in problem


def test_sim_the_rest_of_the_buffer_and_the_placement_do_not_matter():
    """An item's bits depend only on its own addends: the same addends beside other items,
    at another place in the buffer, on other ranks, give the same bits."""
    parts = finite_hard(64, 5, np.float64, seed=9)
    one = local(parts)
    for N in (2, 3, 5):
        shuffled = np.random.default_rng(N).permutation(5)
        by_rank = [[parts[j] for j in shuffled if j % N == r] for r in range(N)]
        got, _ = simulate_exact("rabenseifner", by_rank, 5)
        assert all(same_bits(g, one) for g in got)
    rolled = [np.concatenate([np.roll(p, 7), np.full(9, 1e300)]) for p in parts]
    assert same_bits(np.roll(local(rolled)[:64], -7), one)


def test_sim_bytes_of_both_paths():
    """One addend a rank (EXACT_SUM's op) takes the direct path: each block's addends to
    its owner, raw, then the ring's all-gather of the sums: SUM's bytes, 2G(N-1)/N. Two a
    rank (parts): h·G(N-1)/N raw, the counts (8 B to each peer), the all-gather. More than
    three a rank: the words path, the code pass (G/4) plus the words (2G) through the ring."""
    for dtype, per_item in (("float64", 2 + 16), ("float32", 1 + 8)):
        size = np.dtype(dtype).itemsize
        for N in (2, 3, 4, 8):
            count = 24 * N
            _, sim = simulate_exact("ring", [[np.ones(count, dtype)] for _ in range(N)], N)
            assert sim.bytes_sent == [2 * (N - 1) * count * size // N] * N
            two = [[np.ones(count, dtype)] * 2 for _ in range(N)]
            _, sim = simulate_exact("ring", two, 2 * N)
            assert sim.bytes_sent == [3 * (N - 1) * count * size // N + 8 * (N - 1)] * N
            four = [[np.ones(count, dtype)] * 4 for _ in range(N)]
            _, sim = simulate_exact("ring", four, 4 * N)
            assert sim.bytes_sent == [2 * (N - 1) * count * per_item // N] * N


def test_sim_direct_path_beyond_one_chunk_and_its_ranks_disagreeing(monkeypatch):
    """Blocks longer than a chunk (`exact_direct.CHUNK` bytes, made 64 items) give one rank's bits;
    parts that do not add up to `addends` are refused by every rank once the counts are
    swapped."""
    from mpidp.collectives import exact_direct
    from mpidp.sim.reports import ScheduleError

    monkeypatch.setattr(exact_direct, "CHUNK", 64 * 8)
    count = 2 * 64 * 3 + 5  # rank 0 of 3 owns more than two chunks
    parts = finite_hard(count, 5, np.float64, seed=11)
    one = local(parts)
    for N in (2, 3):
        by_rank = [[p for j, p in enumerate(parts) if j % N == r] for r in range(N)]
        got, _ = simulate_exact("ring", by_rank, 5)
        assert all(same_bits(g, one) for g in got), N
    with pytest.raises(ScheduleError, match=r"the ranks hold 3 parts in all \(rank 0: 2, "
                       r"rank 1: 1\), but addends=4"):
        simulate_exact("ring", [parts[:2], parts[2:3]], 4)


# ------------------------------------------------------------ across ranks (MPI)


def _inputs(count, dtype, rank, seed):
    return finite_hard(count, 1, dtype, seed=1000 * seed + rank)[0]


def _check_all_forms(comm, count, dtype, seed, forms=True):
    """Every algorithm, and (`forms`) every entry point; the oracle is the one-rank exact sum
    of all ranks' inputs."""
    N, r = comm.Get_size(), comm.Get_rank()
    xs = [_inputs(count, dtype, q, seed) for q in range(N)]  # every rank's, known to all
    x = xs[r]
    want = local(xs) if count else np.empty(0, dtype)
    avg = want / np.array(N, dtype) if N > 1 else want
    c = mpidp.Comm(comm)
    for algorithm in mpidp.ALGORITHMS["allreduce"]:
        y = np.full(count, 7, dtype)
        mpidp.allreduce(comm, x, y, op=mpidp.EXACT_SUM, algorithm=algorithm)
        assert same_bits(y, want), ("allreduce", algorithm)
        if not forms:
            continue
        y[...] = x
        mpidp.iallreduce(comm, mpidp.IN_PLACE, y, op="exact_sum", algorithm=algorithm).wait()
        assert same_bits(y, want), ("iallreduce in place", algorithm)
        req = mpidp.allreduce_init(comm, x, y, op=mpidp.EXACT_AVG, algorithm=algorithm)
        for _ in range(2):
            y[...] = 0
            req.Start()
            req.Wait()
            assert same_bits(y, avg), ("allreduce_init avg", algorithm)
        req.Free()
        y = np.full(count, 7, dtype)
        c.Iallreduce(x, y, op=mpidp.EXACT_SUM, algorithm=algorithm).Wait()
        assert same_bits(y, want), ("Comm.Iallreduce", algorithm)
    per = count // N
    for algorithm in mpidp.ALGORITHMS["reduce_scatter"] if forms else ():
        y = np.full(per, 7, dtype)
        mpidp.reduce_scatter(comm, x[: per * N], y, op=mpidp.EXACT_SUM, algorithm=algorithm)
        block = local([v[: per * N] for v in xs])[r * per:(r + 1) * per] if per else y[:0]
        assert same_bits(y, block), ("reduce_scatter", algorithm)
        z = x[: per * N].copy()
        c.Reduce_scatter_block(MPI.IN_PLACE, z, op=mpidp.EXACT_SUM, algorithm=algorithm)
        assert same_bits(z[:per], block) and same_bits(z[per:], x[per:per * N]), algorithm
    # MPI's own SUM agrees within pairwise's bound (a sanity oracle we did not write)
    if dtype == np.float64 and count:
        native = np.empty(count)
        comm.Allreduce(x, native, op=MPI.SUM)
        bound = N * 2.3e-16 * np.sum(np.abs(np.stack(xs)), axis=0)
        assert np.all(np.abs(native - want) <= bound)


# Each test is one launch: its rank counts are communicators of that size split off its
# ranks (tests/helpers/subcomms.py), not a launch each.


@pytest.mark.mpi(ranks=[8], timeout=480)
def test_mpi_every_form_and_algorithm_equals_one_rank(mpi_ranks):
    on_each_size((1, 2, 3, 5, 8), every_form_and_algorithm_equals_one_rank)


def every_form_and_algorithm_equals_one_rank(comm):
    """Counts 0, 1, < N, not divisible, divisible; every form at one of them."""
    cost.set_model(comm, *cost.DEFAULT)  # "auto" without calibrating (seconds under load)
    N = comm.Get_size()
    for i, count in enumerate((0, 1, max(N - 1, 1), 2 * N + 1, 64 * N)):
        _check_all_forms(comm, count, FLOATS[i % 3], seed=i, forms=i in (0, 3))
    # integers: EXACT_SUM is SUM
    xi = np.arange(10, dtype=np.int32) * (comm.Get_rank() + 1)
    yi, zi = np.empty_like(xi), np.empty_like(xi)
    mpidp.allreduce(comm, xi, yi, op=mpidp.EXACT_SUM)
    comm.Allreduce(xi, zi, op=MPI.SUM)
    assert np.array_equal(yi, zi)


@pytest.mark.mpi(ranks=[7], timeout=240)
def test_mpi_parts_spread_unevenly(mpi_ranks):
    on_each_size((1, 2, 4, 7), parts_spread_unevenly)


def parts_spread_unevenly(comm):
    """Rank r holds r addends (rank 0 none), or all are on the last rank: the same bits."""
    cost.set_model(comm, *cost.DEFAULT)
    N, r = comm.Get_size(), comm.Get_rank()
    total = N * (N - 1) // 2 or 1
    everything = finite_hard(301, total, np.float64, seed=N)
    want = local(everything)
    start = r * (r - 1) // 2
    mine = everything[start:start + r] if N > 1 else everything
    for algorithm in ("auto", "ring", "recursive_doubling"):
        out = np.empty(301)
        mpidp.iallreduce_parts(comm, mine, out, addends=total, algorithm=algorithm).wait()
        assert same_bits(out, want), algorithm
        out[...] = 0
        mpidp.allreduce_parts(comm, everything if r == N - 1 else [], out, addends=total)
        assert same_bits(out, want)


@pytest.mark.mpi(ranks=[4], timeout=180)
def test_mpi_bytes_per_rank(mpi_ranks, no_debug_check):
    on_each_size((2, 3, 4), bytes_per_rank)


def bytes_per_rank(comm):
    """EXACT_SUM (one addend a rank) moves SUM's bytes, 2G(N-1)/N, on every N: the direct
    path's raw blocks, then the ring's all-gather of the sums (N = 2: one addition, plain
    SUM). Four parts a rank take the words path: the ring moves 2(N-1)/N of each pass,
    codes (2 B, 1 B per item) and words (16 B, 8 B), 2.25 times SUM's bytes."""
    N = comm.Get_size()
    count = 40 * N
    for dtype, code, words in ((np.float64, 2, 16), (np.float32, 1, 8)):
        counter = CountingComm(comm)
        x = np.ones(count, dtype)
        y = np.empty_like(x)
        mpidp.allreduce(counter, x, y, op=mpidp.EXACT_SUM, algorithm="ring")
        assert counter.bytes_sent == x.nbytes * (N - 1) * 2 // N
        assert np.all(y == N)
        counter = CountingComm(comm)
        mpidp.allreduce_parts(counter, [x] * 4, y, addends=4 * N, algorithm="ring")
        assert counter.bytes_sent == 2 * (N - 1) * count * (code + words) // N
        assert counter.bytes_sent == 2 * (N - 1) * x.nbytes * 9 // (4 * N)  # 2.25 G(N-1)/N
        assert np.all(y == 4 * N)


def top16(x):
    """The 16 high bits of each item (sign, exponent, first mantissa bits), in x's own
    byte order: a big-endian array holds its high bits first, as 16-bit numbers too."""
    little = x.dtype.byteorder == "<" or (x.dtype.byteorder in "=|" and sys.byteorder == "little")
    v = x.view(np.dtype(np.uint16).newbyteorder("<" if little else ">"))
    per = x.itemsize // 2
    return v[per - 1 :: per] if little else v[::per]


def code_table(name: str, code: str) -> np.ndarray:
    """What a code is, spelled out for every value of an item's 16 high bits: the biased
    exponent, except that zero and subnormals code 1 if positive, 0 if negative."""
    info = np.finfo(np.dtype(name))
    shift = 16 - (info.bits - info.nmant - 1)  # 16 - exponent bits
    hi = np.arange(1 << 16, dtype=np.uint32)
    biased = (hi & 0x7FFF) >> (shift - 1)  # the sign dropped, the mantissa bits shifted out
    return np.where((biased == 0) & (hi < 0x8000), 1, biased).astype(code)


@pytest.mark.parametrize("order", ("=", ">", "<"))
@pytest.mark.parametrize("dtype", FLOATS)
def test_codes_and_magic_constants_match_their_tables(dtype, order):
    """The shifts that make codes and magic constants give what the tables spell out,
    the addends in either byte order."""
    x, y, z = (a.astype(np.dtype(dtype).newbyteorder(order))
               for a in hard_addends(4000, 3, dtype, seed=5))
    y[:50] = -0.0  # items whose addends are all zero or subnormal, of either sign
    z[:50] = np.where(np.arange(50) % 2, -0.0, 0.0)
    x[:25] = -np.finfo(dtype).smallest_subnormal
    code, t16 = np.empty(x.size, prerounding.grid(dtype, 3).code), np.empty(x.size, np.uint16)
    table = code_table(np.dtype(dtype).name, code.dtype.name)
    prerounding.max_codes([x], code, np.empty(x.size), None)
    assert np.array_equal(code, table[top16(x)])
    prerounding.max_codes([x, y, z], code, np.empty(x.size), np.empty(x.size))  # the largest
    assert np.array_equal(code, np.maximum.reduce([table[top16(v)] for v in (x, y, z)]))
    assert (code[:50] == 0).any() and (code[:50] == 1).any()
    g = prerounding.grid(dtype, 7)
    m1, m2 = np.empty(x.size), np.empty(x.size)
    prerounding.magics(code, g, m1, m2, t16)
    t1, t2 = prerounding.magic_tables(g)
    assert np.array_equal(m1, t1[code]) and (g.words == 1 or np.array_equal(m2, t2[code]))


@pytest.mark.parametrize("dtype", (*FLOATS, np.dtype(">f4")))
def test_addends_on_their_last_grid_skip_its_rounding(dtype, monkeypatch):
    """A chunk whose addends all lie on their last grid skips rounding them there
    (`on_grid`), with the bits of the rounding path, which a stub forces."""
    from mpidp.collectives import exact_steps

    nmant = np.finfo(dtype).nmant
    taken = []

    def spy(g, code, low):
        taken.append(prerounding.on_grid(g, code, low))
        return taken[-1]

    def both(parts):
        monkeypatch.setattr(exact_steps, "on_grid", spy)
        fast = local(parts)
        monkeypatch.setattr(exact_steps, "on_grid", lambda *a: False)
        return fast, local(parts)

    rng = np.random.default_rng(4)
    for n in (3, 5, 17):
        g = prerounding.grid(dtype, n)
        room = g.B1 + g.B2 - nmant - 1  # binades below the item's largest
        for spread in (2, room):  # binades 2^-spread .. 2^0 of either sign: all on grid
            parts = [(rng.uniform(1, 2, 3000) * rng.choice([-1, 1], 3000)
                      * np.exp2(-rng.integers(0, spread + 1, 3000))).astype(dtype)
                     for _ in range(n)]
            for p in parts:
                p[rng.random(3000) < 0.1] = rng.choice([0.0, -0.0])
            taken.clear()
            fast, slow = both(parts)
            assert all(taken) and taken and same_bits(fast, slow)
        taken.clear()
        fast, slow = both(finite_hard(3000, n, dtype, seed=n))  # the whole range, zeros
        assert same_bits(fast, slow) and all(taken) == (np.dtype(dtype).itemsize == 2)
        if 2.0 ** -(room + 1) < np.finfo(dtype).smallest_subnormal:
            continue  # float16: every addend lies within the room
        # the room's edge: 1 + (1 + 2^-nmant)·2^-room - 1 is on the grid, a bit lower is not
        one = np.ones(2, dtype)
        small = np.array([2.0 ** -room, 2.0 ** -(room + 1)]) * (1 + 2.0 ** -nmant)
        parts = [one, small.astype(dtype), (-one).astype(dtype)] + [np.zeros(2, dtype)] * (n - 3)
        taken.clear()
        fast, slow = both([p[:1] for p in parts])
        assert taken == [True] and same_bits(fast, slow)
        taken.clear()
        fast, slow = both([p[1:] for p in parts])
        assert taken == [False] and same_bits(fast, slow)
        monkeypatch.setattr(exact_steps, "on_grid", lambda *a: True)  # taken there: wrong
        assert not same_bits(local([p[1:] for p in parts]), slow)


@pytest.mark.parametrize("dtype", FLOATS)
def test_sim_ranks_on_and_off_the_grid_sum_alike(dtype, monkeypatch):
    """The words path (more addends than 3 a rank) on 3 ranks: ranks whose addends lie on
    their grid skip the rounding, the one holding a tiny addend rounds, and every rank's
    bits are one rank's (all-reduce, and the reduce-scatter's blocks)."""
    from mpidp.collectives import exact_steps

    taken = []
    monkeypatch.setattr(exact_steps, "on_grid",
                        lambda *a: taken.append(prerounding.on_grid(*a)) or taken[-1])
    rng = np.random.default_rng(2)
    parts = [(rng.uniform(1, 2, 40) * rng.choice([-1, 1], 40)).astype(dtype)
             for _ in range(10)]
    parts[9][3] = np.finfo(dtype).smallest_subnormal * 3  # far below item 3's grid
    one = local(parts)
    by_rank = [parts[0:4], parts[4:6], parts[6:10]]
    got, _ = simulate_exact("ring", by_rank, 10)
    assert all(same_bits(g, one) for g in got)
    assert True in taken and (False in taken) == (dtype != np.float16)  # (float16: all on)
    counts = [13, 0, 27]
    got, _ = simulate_exact("ring", by_rank, 10, collective="reduce_scatter", counts=counts)
    assert same_bits(np.concatenate(got), one)


def test_direct_path_splits_near_addends_at_one_constant(monkeypatch):
    """float64 on the direct path: a chunk whose addends lie within 2^(51-2k) of its
    largest is split at one constant (`split_sum`), with the grid's bits (sum and mean);
    taken a binade further, its second word rounds and the bits differ."""
    from mpidp.collectives import exact_steps

    taken = []
    split = exact_steps.split_sum
    monkeypatch.setattr(exact_steps, "split_sum",
                        lambda *a: taken.append(split(*a)) or taken[-1])
    rng = np.random.default_rng(6)
    for n in (3, 5, 6):
        bound = 51 - 2 * (n - 1).bit_length()
        for spread in (0, bound, bound + 1, 70):
            parts = [rng.uniform(1, 2, 50) * rng.choice([-1, 1], 50) for _ in range(n)]
            for p in parts:
                p[rng.random(50) < 0.2] = rng.choice([0.0, -0.0])
            parts[-1][:2] = [np.ldexp(1.5, -spread), 0.0]
            parts[0][:2] = [1.0, -0.0]  # item 0 spans the spread, item 1 is zeros
            for p in parts:  # item 2: -0.0 everywhere; item 3 too, but for one +0.0
                p[2:4] = -0.0
            parts[1][3] = 0.0
            for average in (False, True):
                one = np.empty(50)
                mpidp.sum_parts(parts, one, average=average)
                taken.clear()
                got, _ = simulate_exact("ring", [parts[0::2], parts[1::2]], n, average=average)
                assert all(same_bits(g, one) for g in got)
                assert taken and all(taken) == (spread <= bound)
                assert same_bits(one[2:4], np.array([-0.0, 0.0]))
    # 2^-50 below the largest, 3 addends (bound 47): on the grid, but not for one constant
    x1 = np.array([1 + 2.0 ** -48 + 2.0 ** -52])
    parts = [x1, np.array([2.0 ** -50 * (1 + 2.0 ** -52)]), -x1]
    one = local(parts)
    g = prerounding.grid(np.float64, 3)
    extent = exact_steps.extent
    monkeypatch.setattr(exact_steps, "extent",  # the smallest code said to be the largest
                        lambda *a: (extent(*a)[0],) * 2)
    out = np.empty(1)
    exact_steps.local_sum(parts, out, g, exact_steps.scratch_for(ScratchPool(), g, 1, 0, 0))
    assert taken[-1] and not same_bits(out, one) and one[0] == parts[1][0]


@pytest.mark.parametrize("dtype", (np.float32, np.float16))
def test_direct_path_sums_addends_on_their_grid_without_codes(dtype, monkeypatch):
    """float32 and float16 on the direct path: a chunk whose addends lie on their last grid
    (`on_grid`) is summed in float64 as it is, with no code per item (`near_sum`), and
    gives one rank's bits (sum and mean, -0.0 where every addend is, +0.0 where addends
    cancel: one word keeps IEEE's signs, no `negative_zeros`); a chunk with an
    addend off the grid, or an inf, takes the codes."""
    from mpidp.collectives import exact_steps

    taken = []
    near = exact_steps.near_sum
    monkeypatch.setattr(exact_steps, "near_sum", lambda *a: taken.append(near(*a)) or taken[-1])
    rng = np.random.default_rng(9)
    tiny = np.finfo(dtype).smallest_subnormal
    for n in (3, 5):
        g = prerounding.grid(dtype, n)
        room = g.B1 + g.B2 - np.finfo(dtype).nmant - 1
        for spread, on in ((2, True), (room, True), (room + 1, dtype == np.float16), (0, False)):
            parts = [(rng.uniform(1, 2, 40) * rng.choice([-1, 1], 40)).astype(dtype)
                     for _ in range(n)]
            for p in parts:
                p[rng.random(40) < 0.2] = rng.choice([0.0, -0.0])
                p[2:5] = -0.0  # item 2: -0.0 everywhere; item 3 too, but for one +0.0
            parts[1][3] = 0.0
            parts[0][4], parts[1][4] = 1.5, -1.5  # item 4: -0.0 but for two that cancel
            if spread:  # off the grid a binade beyond the room (float16: the room is all)
                parts[-1][0] = (np.ldexp(1.5, -spread) * (1 + 2.0 ** -9)).astype(dtype)
            else:
                parts[-1][0] = np.inf
            for average in (False, True):
                one = np.empty(40, dtype)
                mpidp.sum_parts(parts, one, average=average)
                taken.clear()
                got, _ = simulate_exact("ring", [parts[0::2], parts[1::2]], n, average=average)
                assert all(same_bits(x, one) for x in got)
                assert taken and all(taken) == on
                assert same_bits(one[2:5], np.array([-0.0, 0.0, 0.0], dtype))
    # subnormals alone (on their grid): a mean of three rounds the smallest to a zero
    parts = [np.array(x, dtype) for x in ([-tiny, -tiny, tiny, 0.0], [-0.0, 0.0, -tiny, -0.0],
                                          [-0.0, -0.0, -0.0, -0.0])]
    for average in (False, True):
        one = np.empty(4, dtype)
        mpidp.sum_parts(parts, one, average=average)
        taken.clear()
        got, _ = simulate_exact("ring", [parts[:2], parts[2:]], 3, average=average)
        assert all(same_bits(x, one) for x in got) and taken and all(taken)
        assert one[0] == one[1] == one[3] == 0 or not average


def test_sim_cli_check_and_volume(capsys):
    """`python -m mpidp.sim check ALGO --exact` and `volume --exact` run and say so."""
    from mpidp.sim.__main__ import main

    assert main(["check", "ring", "--exact", "--ranks", "1-3", "--quick"]) == 0
    assert "mpidp.sim check ring --exact (allreduce), N = 1-3: ok" in capsys.readouterr().out
    assert main(["volume", "--exact", "--ranks", "2,3,4"]) == 0
    rows = {line.split("|")[0].strip(): line for line in capsys.readouterr().out.splitlines()
            if "|" in line}
    assert rows["2"].split("|")[1].split()[0] == "1.000"  # two addends: SUM's bytes
    assert rows["3"].split("|")[1].split()[0] == "1.333"  # the direct path: SUM's 2(N-1)/N
    assert rows["4"].split("|")[1].split()[0] == "1.500"
