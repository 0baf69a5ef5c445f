"""The ordered sum of parts (``iallreduce_parts(..., ordered=True)``, ordered.py).

The oracle is NumPy's own arithmetic on one process: the left fold of the whole
sequence of addends (rank 0's parts, then rank 1's, ...), in float32 for float16
parts, then divided by their number for the average. Every rank's bits must be
that fold's, however the sequence is cut among ranks (none on some), on N = 1..8,
11 and 16 simulated ranks and on real MPI communicators of 1, 2, 3, 5 and 8 ranks;
on 2 ranks holding one part each, also the MPI library's own ``Allreduce`` (a + b).
The data are chosen so that another order gives other bits (checked), so a sum
that added in another order, or exactly, would fail.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives import cost, ordered, ordered_chain
from mpidp.collectives.algorithms import entry
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.exact import GATHER_FOR
from mpidp.collectives.exact_direct import chunk_items, direct_items, direct_rounds
from mpidp.collectives.ordered import Acc, Count, local_ordered, wide
from mpidp.collectives.ordered_chain import Route, chain_rounds
from mpidp.collectives.state import CommState, state
from mpidp.sim.engine import Sim

FLOATS = (np.float64, np.float32, np.float16)


def oracle(sequence, dtype, average=False):
    """NumPy's left fold of `sequence` (float16 in float32), averaged."""
    w = np.dtype(np.float32 if np.dtype(dtype).itemsize < 4 else dtype).newbyteorder("=")
    acc = sequence[0].astype(w)
    with np.errstate(over="ignore", invalid="ignore"):
        for x in sequence[1:]:
            acc = acc + x.astype(w)
        if average and len(sequence) > 1:
            acc = acc / w.type(len(sequence))
        return acc.astype(dtype)


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def hard(count, addends, dtype, seed):
    """Addends of mixed signs and magnitudes: their sum depends on the order of adding.
    (float16, summed in float32, needs more than float32's 24 bits between an item's
    addends for that: +-2^14, which cancel exactly, beside tiny ones absorbed or not.)"""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).itemsize == 2:
        kinds = np.array([2.0 ** 14, -(2.0 ** 14), 2.0 ** -12, 2.0 ** -12])  # bigs cancel
        return [(kinds[k] * np.where(k < 2, 1, rng.uniform(1, 2, count))).astype(dtype)
                for k in rng.integers(0, 4, (addends, count))]
    return [(rng.standard_normal(count) * 2.0 ** rng.integers(-12, 12, count)).astype(dtype)
            for _ in range(addends)]


def cut(sequence, held):
    """Rank r's parts: the next held[r] of the sequence."""
    at = np.cumsum([0, *held])
    return [sequence[at[r]:at[r + 1]] for r in range(len(held))]


def simulate(by_rank, count, dtype, *, counts=None, average=False, known=False,
             algorithm="ring", path="direct", segments=1):
    """The ordered all-reduce (reduce-scatter with `counts`) on len(by_rank) simulated
    ranks, through the real rounds and local sum of the direct path or (``path="chain"``)
    the chain, cut into `segments`; each rank's result."""
    N = len(by_rank)
    addends = sum(len(p) for p in by_rank)
    rs = counts is not None
    layout = Blocks(counts) if rs else Blocks.even(count, N)
    total = layout.total
    held = [len(p) for p in by_rank] if known or N == 1 else None
    sim, gens, outs = Sim(N), [], []
    for r, comm in enumerate(sim.comms):
        out = np.full(layout.counts[r] if rs else count, 77, dtype)
        parts = [p.copy() for p in by_rank[r]]
        if path == "chain":
            bcast = None if rs or N == 1 else entry(
                "bcast", "binomial" if algorithm == "ring" else "scatter_allgather").bound(None)
            gens.append(chain_rounds(comm, parts, out, addends, np.full(total, 55, wide(dtype)),
                                     Blocks.even(total, segments), bcast,
                                     np.zeros(N, np.int64), held, average,
                                     layout if rs else None, np.full(total, 66, dtype)))
        else:
            gather = None if rs or N == 1 else entry(
                "allgather", GATHER_FOR.get(algorithm, "recursive_doubling")).bound(None)
            s = Acc(np.empty(chunk_items(layout.counts[r], dtype), wide(dtype)))
            recv = np.empty(direct_items(Count(addends), layout, r, len(by_rank[r])), dtype)
            gens.append(direct_rounds(comm, parts, out, Count(addends), gather, s, recv,
                                      np.zeros(N, np.int64), local_ordered, average,
                                      layout if rs else None, held))
        outs.append(out)
    sim.run(gens)
    return outs


PATHS = [  # (path, segments, the algorithm naming the all-gather or broadcast)
    ("direct", 1, "ring"),
    ("chain", 1, "ring"),  # binomial broadcast
    ("chain", 3, "rabenseifner"),  # scatter + all-gather broadcast
]


# ------------------------------------------------------------ breadth (simulated)


def spreads(N, P):
    """Ways to cut P addends over N ranks: even-ish, all on the last rank, rank 0 none."""
    even = [P // N + (r < P % N) for r in range(N)]
    yield even
    yield [0] * (N - 1) + [P]
    if N > 1:
        yield [0, *[P // (N - 1) + (r < P % (N - 1)) for r in range(N - 1)]]


@pytest.mark.parametrize("path, segments, algorithm", PATHS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_sim_every_cut_of_the_sequence_gives_the_one_process_fold(dtype, path, segments,
                                                                  algorithm):
    """N = 1..8, 11, 16; counts 0, 1, below N, not divisible by N, beyond one chunk
    (float16: 2 chunks); sum and average; counts swapped or passed (`held`); both paths,
    the chain in one segment and in three (some empty)."""
    how = {"path": path, "segments": segments, "algorithm": algorithm}
    cases = 0
    for N in (*range(1, 9), 11, 16):
        for count in sorted({0, 1, max(N - 1, 1), 3 * N + 2}):
            P = N + 2
            seq = hard(count, P, dtype, seed=N * 100 + count)
            for held in spreads(N, P):
                for average in (False, True):
                    want = oracle(seq, dtype, average)
                    for known in (False, True):
                        for out in simulate(cut(seq, held), count, dtype, average=average,
                                            known=known, **how):
                            assert same_bits(out, want), (N, count, held, average, known)
                        cases += 1
    big = chunk_items(1 << 30, dtype) + 5  # more than one chunk on a rank
    seq = hard(2 * big, 5, dtype, seed=7)
    for out in simulate(cut(seq, [2, 3]), 2 * big, dtype, average=True, **how):
        assert same_bits(out, oracle(seq, dtype, True))
    assert cases > 400


@pytest.mark.parametrize("path, segments, algorithm", PATHS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_sim_reduce_scatter_gives_each_rank_its_block_of_the_fold(dtype, path, segments,
                                                                  algorithm):
    for N in (1, 2, 3, 5, 8):
        counts = [(3 * r + 1) % 4 for r in range(N)]  # a zero block among them
        count, P = sum(counts), 2 * N + 1
        seq = hard(count, P, dtype, seed=N)
        want = oracle(seq, dtype, average=True)
        at = np.cumsum([0, *counts])
        for held in spreads(N, P):
            outs = simulate(cut(seq, held), count, dtype, counts=counts, average=True,
                            path=path, segments=segments)
            for r, out in enumerate(outs):
                assert same_bits(out, want[at[r]:at[r + 1]]), (N, held, r)


def test_the_data_make_the_order_matter():
    """Without this the tests above could pass for a sum in another order: the same
    addends reversed, or summed exactly, give other bits at many items."""
    for dtype in FLOATS:
        seq = hard(500, 7, dtype, seed=1)
        forward, backward = oracle(seq, dtype), oracle(seq[::-1], dtype)
        assert (forward != backward).sum() > 20, dtype
        exact = np.empty(500, dtype)
        mpidp.sum_parts(seq, exact)
        assert (forward != exact).sum() > 20, dtype


def test_sim_an_order_of_ranks_other_than_theirs_is_caught(monkeypatch):
    """The check can fail: a local sum that takes the ranks' addends last rank first."""
    seq = hard(40, 6, np.float32, seed=3)
    want = oracle(seq, np.float32)
    assert all(same_bits(o, want) for o in simulate(cut(seq, [2, 2, 2]), 40, np.float32))

    def reversed_ranks(parts, out, n, s, average=False, theirs=local_ordered):
        theirs([*parts[4:], *parts[2:4], *parts[:2]], out, n, s, average)

    monkeypatch.setitem(globals(), "local_ordered", reversed_ranks)
    assert not any(same_bits(o, want) for o in simulate(cut(seq, [2, 2, 2]), 40, np.float32))


def test_sim_a_chain_that_adds_a_rank_s_parts_out_of_order_is_caught(monkeypatch):
    """The chain's check can fail too: each rank adding its own parts last one first."""
    seq = hard(40, 6, np.float32, seed=3)
    want = oracle(seq, np.float32)
    how = {"path": "chain", "segments": 2}
    assert all(same_bits(o, want) for o in simulate(cut(seq, [2, 2, 2]), 40, np.float32, **how))
    theirs = ordered_chain.add
    monkeypatch.setattr(ordered_chain, "add", lambda acc, parts: theirs(acc, parts[::-1]))
    assert not any(same_bits(o, want)
                   for o in simulate(cut(seq, [2, 2, 2]), 40, np.float32, **how))


SPECIAL = [  # (the addends of one item, in order; the result, "nan" for the canonical NaN)
    ([-0.0, -0.0, -0.0], "-0"),
    ([-0.0, 0.0, -0.0], "+0"),
    ([1.0, -1.0], "+0"),
    ([np.inf, 1.0], np.inf),
    ([np.inf, -np.inf], "nan"),
    ([-np.inf, -np.inf, 5.0], -np.inf),
    ([1.0, "payload", 2.0], "nan"),
    (["payload", np.inf], "nan"),
]


def _value(a, dtype):
    if a == "payload":  # a NaN with a payload of its own, not the canonical one
        bits = {2: 0x7E01, 4: 0x7FC00123, 8: 0x7FF8000000000123}[np.dtype(dtype).itemsize]
        return np.array(bits, f"u{np.dtype(dtype).itemsize}").view(dtype)
    return np.array(a, dtype)


@pytest.mark.parametrize("path, segments, algorithm", PATHS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_sim_special_values_follow_ieee_with_the_canonical_nan(dtype, path, segments,
                                                               algorithm):
    canonical = np.array(np.nan, dtype).tobytes()
    how = {"path": path, "segments": segments, "algorithm": algorithm}
    for addends, result in SPECIAL:
        seq = [np.array([_value(a, dtype)] * 3, dtype) for a in addends]
        for N in (1, 2, 3):
            for held in spreads(N, len(seq)):  # (rank 0 holding none among them)
                for out in simulate(cut(seq, held), 3, dtype, **how):
                    for item in out:
                        if result == "nan":
                            assert item.tobytes() == canonical, (addends, N, held)
                        elif result in ("-0", "+0"):
                            assert item == 0 and np.signbit(item) == (result == "-0"), addends
                        else:
                            assert item == result, (addends, N, held)


def test_no_addends_at_all_give_negative_zero():
    for average in (False, True):
        out = np.ones(5, np.float32)
        mpidp.sum_parts([], out, average=average, ordered=True)
        assert same_bits(out, np.full(5, -0.0, np.float32))


@pytest.mark.parametrize("order", (">f2", ">f4", ">f8", "<f2", "<f4", "<f8"))
def test_parts_in_either_byte_order_sum_as_native_ones(order):
    seq = hard(301, 5, np.dtype(order).newbyteorder("="), seed=2)
    native = np.empty(301, seq[0].dtype)
    mpidp.sum_parts(seq, native, average=True, ordered=True)
    theirs = [x.astype(order) for x in seq]
    out = np.empty(301, order)
    mpidp.sum_parts(theirs, out, average=True, ordered=True)
    assert np.array_equal(out.astype(native.dtype), native)
    assert same_bits(native, oracle(seq, native.dtype, average=True))


# ------------------------------------------------------------ refusals


def test_held_is_refused_where_this_rank_can_see_it_is_wrong():
    x = np.ones(4, np.float32)
    out = np.empty(4, np.float32)
    bad = [([2, 1], ValueError, "one number of parts per rank"),
           ([-1], ValueError, "adding up to addends=2"),
           ([3], ValueError, "adding up to addends=2"),
           (2, TypeError, "held must be a list"),
           ([2.0], TypeError, r"held\[0\] must be a whole number")]
    for held, error, words in bad:
        with pytest.raises(error, match=words):
            mpidp.allreduce_parts(MPI.COMM_SELF, [x, x], out, addends=2, ordered=True,
                                  held=held)
    with pytest.raises(TypeError, match="takes float arrays"):
        mpidp.allreduce_parts(MPI.COMM_SELF, [np.ones(3, np.int64)], np.empty(3, np.int64),
                              addends=1, ordered=True)


# ------------------------------------------------------------ depth (MPI)


@pytest.mark.mpi(ranks=[8], timeout=300)
def test_mpi_every_form_equals_the_one_process_fold(mpi_ranks):
    on_each_size((1, 2, 3, 5, 8), every_form_equals_the_fold)


def every_form_equals_the_fold(comm):
    """Blocking and I-form, all-reduce and reduce-scatter, counts swapped or passed,
    every all-reduce algorithm's all-gather; 2 ranks of one part: MPI's Allreduce. The
    exact sum with `held` (its direct path: no counts swapped) as without."""
    N, r = comm.Get_size(), comm.Get_rank()
    for dtype in FLOATS:
        for count in sorted({0, 1, max(N - 1, 1), 7 * N + 3, 70_001}):
            P = 2 * N + 1
            seq = hard(count, P, dtype, seed=N * 10 + count % 7)
            held = [P // N + (q < P % N) for q in range(N)]
            mine = cut(seq, held)[r]
            want = oracle(seq, dtype, average=True)
            seq2 = hard(count, P, dtype, seed=N * 10 + count % 7 + 1)  # a persistent's 2nd start
            later = cut(seq2, held)[r], oracle(seq2, dtype, average=True)
            for algorithm in ("auto", *mpidp.ALGORITHMS["allreduce"]):
                out = np.full(count, 77, dtype)
                mpidp.iallreduce_parts(comm, mine, out, addends=P, algorithm=algorithm,
                                       average=True, ordered=True).wait()
                assert same_bits(out, want), (dtype, count, algorithm)
            out = np.full(count, 77, dtype)
            mpidp.allreduce_parts(comm, mine, out, addends=P, average=True, ordered=True,
                                  held=held)
            assert same_bits(out, want), (dtype, count, "held")
            counts = [count // N + (q < count % N) for q in range(N)]
            lo = sum(counts[:r])
            block = np.full(counts[r], 77, dtype)
            mpidp.ireduce_scatter_parts(comm, mine, block, counts, addends=P, average=True,
                                        ordered=True, held=held).wait()
            assert same_bits(block, want[lo:lo + counts[r]]), (dtype, count, "rs")
            for route in (Route(True, 1), Route(True, 3), Route(False)):  # each path forced
                both_paths_give_the_fold(comm, route, (mine, want), later, held, counts)
            exact, told = np.empty(count, dtype), np.empty(count, dtype)  # the exact sum:
            mpidp.allreduce_parts(comm, mine, exact, addends=P)  # `held` skips a round only
            mpidp.allreduce_parts(comm, mine, told, addends=P, held=held)
            assert same_bits(told, exact), (dtype, count, "exact, held")
            bufs = [np.empty_like(x) for x in mine]  # the exact sum, persistent: each start
            req = mpidp.allreduce_parts_init(comm, bufs, told, addends=P)  # sums them anew
            for src in (later[0], mine):
                for b, x in zip(bufs, src, strict=True):
                    b[...] = x
                req.Start()
                req.Wait()
                mpidp.allreduce_parts(comm, src, exact, addends=P)
                assert same_bits(told, exact), (dtype, count, "exact, persistent")
            req.Free()
    if N == 2:
        x = hard(1001, 2, np.float32, seed=5)[r]
        native, out = np.empty_like(x), np.empty_like(x)
        comm.Allreduce(x, native, op=MPI.SUM)
        mpidp.allreduce_parts(comm, [x], out, addends=2, ordered=True)
        assert same_bits(out, native)


def both_paths_give_the_fold(comm, route, first, later, held, counts):
    """``auto``'s all-reduce and reduce-scatter, counts swapped or passed, on the path
    `route` names, whatever the model would pick (on a comm of its own: the path of a
    call is remembered per comm); persistent, started on `first` (this rank's parts,
    the fold), then on `later`'s, in the same buffers."""
    r, dup = comm.Get_rank(), comm.Dup()
    cost.set_model(dup, *cost.DEFAULT)  # (not calibrated again for each comm: seconds on 8)
    (mine, want), lo, at = first, sum(counts[:r]), f"{route}"
    try:
        with mock.patch.object(ordered, "route", lambda *args: route):
            for told in (None, held):
                out = np.full(want.size, 77, want.dtype)
                mpidp.allreduce_parts(dup, mine, out, addends=sum(held),
                                      average=True, ordered=True, held=told)
                assert same_bits(out, want), (at, told)
                block = np.full(counts[r], 77, want.dtype)
                mpidp.ireduce_scatter_parts(dup, mine, block, counts, addends=sum(held),
                                            average=True, ordered=True, held=told).wait()
                assert same_bits(block, want[lo:lo + counts[r]]), (at, told, "rs")
            bufs = [np.empty_like(x) for x in mine]
            kw = {"addends": sum(held), "average": True, "ordered": True}
            reqs = (mpidp.allreduce_parts_init(dup, bufs, out, **kw),
                    mpidp.reduce_scatter_parts_init(dup, bufs, block, counts, held=held, **kw))
            for src, fold in (first, later):
                for b, x in zip(bufs, src, strict=True):
                    b[...] = x
                for req in reqs:
                    req.Start()
                    req.Wait()
                assert same_bits(out, fold), (at, "persistent")
                assert same_bits(block, fold[lo:lo + counts[r]]), (at, "persistent rs")
            for req in reqs:
                req.Free()
    finally:
        dup.Free()


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_mpi_ranks_disagreeing_on_the_parts_they_hold_all_raise(mpi_ranks):
    """Without `held`, the ranks swap their counts and all raise where they do not add
    up to `addends` (no rank waits for a message that never comes); ranks passing
    different `held` lists all raise under the debug check."""
    comm = MPI.COMM_WORLD
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match=r"the ranks hold 3 parts in all .* addends=4"):
        mpidp.allreduce_parts(comm, [x], np.empty(10, np.float32), addends=4, ordered=True)
    # ranks passing different `held` lists: with the debug check, all refuse the call
    held = [1, 1, 1] if comm.Get_rank() == 0 else [0, 1, 2]
    mine = [x] * held[comm.Get_rank()]
    with pytest.raises(ValueError, match="ranks disagree on the arguments"):
        mpidp.allreduce_parts(comm, mine, np.empty(10, np.float32), addends=3, ordered=True,
                              held=held, debug=True)


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_mpi_the_route_prices_adds_as_measured_where_the_model_was_calibrated(mpi_ranks,
                                                                              monkeypatch):
    """A calibrated model's γ is not what the route reads (it moves 10x from run to run):
    `addrate.add_rate` times this vector's adds, the slowest rank's, the same on every
    rank. A model given (`set_model`, ``MPIDP_COST``) is read as given."""
    monkeypatch.delenv("MPIDP_COST", raising=False)
    comm, seen = MPI.COMM_WORLD, []

    def spy(m, *args):
        seen.append(m.gamma)
        return Route(False)

    monkeypatch.setattr(ordered, "route", spy)
    x = [np.ones(5000, np.float32)] * 2
    dup, calibrated = comm.Dup(), comm.Dup()
    try:
        cost.set_model(dup, *cost.DEFAULT)  # given: read as it is
        assert not state(dup).measured
        mpidp.allreduce_parts(dup, x, np.empty(5000, np.float32), addends=6, ordered=True)
        assert seen == [cost.DEFAULT.gamma]
        cost.model(calibrated)  # calibrated: the adds are timed
        assert state(calibrated).measured
        mpidp.allreduce_parts(calibrated, x, np.empty(5000, np.float32), addends=6,
                              ordered=True)
        everyone = comm.allgather(seen[-1])
        assert len(seen) == 2 and everyone == [seen[-1]] * comm.Get_size(), everyone
        assert 0 < seen[-1] < 1e-6 and seen[-1] != state(calibrated).model.gamma
        child = CommState()
        child.inherit(state(calibrated))  # a duplicate of it (DataParallel's) times too
        assert child.measured
        cost.set_model(calibrated, *cost.DEFAULT)  # given again: read as given
        assert not state(calibrated).measured
    finally:
        dup.Free()
        calibrated.Free()


def test_the_doctor_leaves_an_ordered_sum_out_of_its_replay_and_says_what_it_is():
    from mpidp.doctor.replay import _replayable

    call = {"collective": "allreduce", "tag": 5, "op": "ordered_avg", "algorithm": "ordered+ring"}
    assert _replayable(call).startswith("an ordered sum of parts")
