"""Recursive halving / doubling, Rabenseifner and the fold: checked against MPI.

Every multi-rank check runs for N = 1..8 (powers of two and not), all in one launch of 8
ranks (a communicator of each size: tests/helpers/subcomms.py), and loops over
ops × dtypes × counts (the sweeps are tests/helpers/sweeps.py's,
which test_tree.py and test_direct.py run for the trees and direct). Inputs are
small integers, stored in whatever dtype is tested, so sums, products and averages
are exact in every summation order and results must equal MPI's bit for bit; one
random-float case checks the tolerance that summation order allows.
"""

import itertools

import numpy as np
import pytest
from helpers.oracle import DTYPES, assert_same, make_input, native_reduce_scatter
from helpers.subcomms import on_each_size
from helpers.sweeps import (
    LARGE,
    check_allreduce_matches_mpi_bit_for_bit,
    check_allreduce_random_floats_agree_across_ranks,
    debug_check_off,
    dtype_ops,
    traffic,
)

from mpidp.collectives import api, waitall
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.fold import VirtualBlocks, masks
from mpidp.collectives.algorithms.halving import doubling, fold, halving
from mpidp.collectives.algorithms.nearest import placed_doubling, placed_halving
from mpidp.collectives.algorithms.ops import SUM
from mpidp.sim import Sim

SIZES = range(1, 9)
HALVING = ("rabenseifner", "recursive_doubling")  # the all-reduces of this file
ALLREDUCE_ALGOS = (*HALVING, "naive", "direct")  # all in flight together: the I-forms' check


def check_reduce_scatter_matches_mpi(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    layouts = [[c] * n for c in (0, 1, 3)]  # Reduce_scatter_block
    layouts += [[i % 3 for i in range(n)], [(13 + i) // n for i in range(n)],  # recvcounts
                [0] * (n - 1) + [10], [10] + [0] * (n - 1), [2 * i + 1 for i in range(n)]]
    for i, (dtype, op) in enumerate(dtype_ops()):
        for counts in layouts[i % 3 :: 3]:
            x = make_input(op, dtype, sum(counts), rank, seed=200)
            ref = native_reduce_scatter(comm, x, counts, op)
            out = np.full(counts[rank], 9, dtype)
            api.reduce_scatter(comm, x, out, counts, op, algorithm="recursive_halving")
            assert_same(out, ref, f"{dtype} {op} {counts}")
            if dtype != "int64":
                continue
            inplace = x.copy()
            api.reduce_scatter(comm, api.IN_PLACE, inplace, counts, op,
                               algorithm="recursive_halving")
            assert_same(inplace[: counts[rank]], ref, f"{dtype} {op} {counts} in place")
    if n not in LARGE:
        return
    rng = np.random.default_rng(200 + rank)
    x = rng.integers(-9, 9, n * (1 << 18)).astype(np.int32)  # 1 Mi items at N = 4
    ref = np.empty(1 << 18, np.int32)
    comm.Reduce_scatter_block(x, ref)
    out = np.empty_like(ref)
    api.reduce_scatter(comm, x, out, algorithm="recursive_halving")
    assert np.array_equal(out, ref)


def check_allgather_matches_mpi(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    for dtype in DTYPES:
        for counts in ([0] * n, [1] * n, [5] * n, [i % 3 for i in range(n)],
                       [(101 + i) // n for i in range(n)], [0] * (n - 1) + [7]):
            mine = (np.arange(counts[rank]) + 100 * rank).astype(dtype)
            # packed (Allgather / Allgatherv), then reversed blocks with gaps (Allgatherv)
            reversed_gaps = [sum(counts[j] + 2 for j in range(i + 1, n)) + 1 for i in range(n)]
            for displs in (None, reversed_gaps):
                size = sum(counts) if displs is None else sum(counts) + 2 * n + 1
                ref = np.full(size, 55, dtype)
                comm.Allgatherv(mine, [ref, counts] if displs is None else [ref, (counts, displs)])
                out = np.full(size, 55, dtype)  # gaps must keep their 55s
                api.allgather(comm, mine, out, counts, displs, algorithm="recursive_doubling")
                assert np.array_equal(out, ref), (dtype, counts, displs)
    if n not in LARGE:
        return
    big = np.full(1 << 18, rank, np.int64)  # 1 Mi items at N = 4
    ref = np.empty(n << 18, np.int64)
    comm.Allgather(big, ref)
    out = np.empty_like(ref)
    api.allgather(comm, big, out, algorithm="recursive_doubling")
    assert np.array_equal(out, ref)


def check_nonblocking_forms_run_concurrently(comm):
    """Every algorithm is a schedule, so I-forms come free; several can be in flight at once."""
    n, rank = comm.Get_size(), comm.Get_rank()
    xs = [np.arange(count, dtype=np.float64) + rank for count in (3, 100, 1000, 5000, 7)]
    handles, outs = [], []
    for algo, x in zip(("ring", *ALLREDUCE_ALGOS), xs, strict=True):
        outs.append(np.empty_like(x))
        handles.append(api.iallreduce(comm, x, outs[-1], algorithm=algo))
    rs = np.arange(6 * n, dtype=np.int64)
    rs_out = np.empty(6, np.int64)
    handles.append(api.ireduce_scatter(comm, rs, rs_out, algorithm="recursive_halving"))
    ag_out = np.empty(4 * n, np.int32)
    handles.append(api.iallgather(comm, np.full(4, rank, np.int32), ag_out,
                                  algorithm="recursive_doubling"))
    bc = np.arange(50.0) if rank == n - 1 else np.zeros(50)
    handles.append(api.ibcast(comm, bc, n - 1, algorithm="scatter_allgather"))
    waitall(handles)
    for x, y in zip(xs, outs, strict=True):
        assert np.array_equal(y, n * (np.arange(x.size) + (n - 1) / 2))
    assert np.array_equal(rs_out, n * rs[6 * rank : 6 * rank + 6])
    assert np.array_equal(ag_out, np.repeat(np.arange(n), 4))
    assert np.array_equal(bc, np.arange(50.0))


# ------------------------------------------------------------- volume and rounds


def check_volume_and_rounds_match_the_docstrings(comm):
    """Bytes sent per rank (G = the vector's bytes, b = one rank's block, q = 2^floor(log2 N)):

    reduce-scatter:  main-loop ranks: G minus the (virtual) block they keep; the
                     fold adds, for the odd rank of a pair, G/2 before and its
                     partner's block after; the even rank sends G (two halves)
                     in 3 rounds. Rounds: log2 q, or log2 q + 3 for an odd one.
    all-gather:      G(q-1)/q (equal blocks, N = q); in all, the loop sends (q-1)·G
                     over all ranks; the even rank of a pair sends its block, the
                     odd one all G after the loop; rounds log2 q, log2 q + 2, and 2.
    Rabenseifner:    2G(q-1)/q (q dividing the count); the odd rank of a pair also
                     G/2 + G, the even one G; rounds 2 log2 q, 2 log2 q + 3, and 3.
    rec. doubling:   G log2 q; the odd rank of a pair also G, the even one G;
                     rounds log2 q, log2 q + 2, and 2.
    (direct: test_direct.py; the trees: test_tree.py.)
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    q, r = fold(n)
    k = q.bit_length() - 1
    folded, idle = rank < 2 * r, rank < 2 * r and rank % 2 == 0
    items = 840 * 2  # divisible by 2, by every n <= 8 and every q
    x = np.ones(items, np.float64)
    G, half = x.nbytes, (items // 2) * 8

    # Rabenseifner: 2·G·(q-1)/q in 2·log2 q rounds; the fold per the docstring above
    sent, rounds = traffic(comm, lambda c: api.iallreduce(c, x, np.empty_like(x),
                                                          algorithm="rabenseifner"))
    main = 2 * G * (q - 1) // q
    if idle:
        assert (sent, rounds) == (G, 3)
    elif folded:
        assert (sent, rounds) == (half + main + G, 2 * k + 3)
    else:
        assert (sent, rounds) == (main, 2 * k)

    # recursive doubling: G·log2 q in log2 q rounds
    sent, rounds = traffic(comm, lambda c: api.iallreduce(c, x, np.empty_like(x),
                                                          algorithm="recursive_doubling"))
    if idle:
        assert (sent, rounds) == (G, 2)
    elif folded:
        assert (sent, rounds) == (G * k + G, k + 2)
    else:
        assert (sent, rounds) == (G * k, k)

    # recursive halving reduce-scatter: G minus the (virtual) block kept
    b = G // n
    sent, rounds = traffic(comm, lambda c: api.ireduce_scatter(
        c, x, np.empty(items // n), algorithm="recursive_halving"))
    if idle:
        assert (sent, rounds) == (G, 3)
    elif folded:
        assert (sent, rounds) == (half + (G - 2 * b) + b, k + 3)
    else:
        assert (sent, rounds) == (G - b, k)

    # recursive doubling all-gather: per rank G·(q-1)/q for q = n; fold per the docstring above
    sent, rounds = traffic(comm, lambda c: api.iallgather(
        c, np.ones(items // n), np.empty(items), algorithm="recursive_doubling"))
    total = np.zeros(1, np.int64)
    comm.Allreduce(np.array([sent], np.int64), total)
    if r == 0:
        assert (sent, rounds) == (G * (q - 1) // q, k)
    assert int(total[0]) == r * b + (q - 1) * G + r * G
    assert rounds == (2 if idle else k + 2 if folded else k)


def check_unknown_algorithm_is_refused(comm):
    x = np.ones(4)
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):
        api.allreduce(comm, x, np.empty_like(x), algorithm="butterfly")


def nan_with_payload(rank: int, count: int = 1, dtype="float64") -> np.ndarray:
    """`count` quiet NaNs whose payload is rank-specific (rank + 1, so none is 0)."""
    dt = np.dtype(dtype)
    bits = np.dtype(f"u{dt.itemsize}")
    x = np.full(count, np.nan, dt)
    x.view(bits)[...] |= bits.type(rank + 1)
    return x


def check_nan_payloads_agree(comm):
    """SUM of one NaN per rank, each with its own payload: every rank the same bits (NumPy
    keeps the first operand's payload, unless the output is that operand and the vector
    has one item: then the second's)."""
    n, rank = comm.Get_size(), comm.Get_rank()

    def agreed(y, *case):
        rows = np.empty((n, y.nbytes), np.uint8)
        comm.Allgather(y.view(np.uint8), rows)
        assert (rows == rows[0]).all(), (*case, rows)

    for algorithm in ALLREDUCE_ALGOS:
        for in_place in (False, True):
            for dtype in ("float64", "float32"):
                x = nan_with_payload(rank, 1, dtype)
                y = x.copy() if in_place else np.empty_like(x)
                api.allreduce(comm, api.IN_PLACE if in_place else x, y, algorithm=algorithm)
                agreed(y, algorithm, in_place, dtype)
            zero = np.array([-0.0 if rank % 2 else 0.0])  # MAX of -0.0 and 0.0: by the order
            y = zero.copy()
            api.allreduce(comm, api.IN_PLACE, y, op="max", algorithm=algorithm)
            agreed(y, algorithm, "max")
            y = nan_with_payload(rank)  # a persistent all-reduce's replayed starts
            req = api.allreduce_init(comm, api.IN_PLACE, y, algorithm=algorithm)
            for start in range(2):
                y[...] = nan_with_payload(rank)
                req.Start()
                req.Wait()
                agreed(y, algorithm, "persistent", start)
            req.Free()


@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGOS)
def test_sim_nan_payloads_agree_on_every_rank(algorithm):
    """N = 2..8 simulated: one NaN a rank, payloads of their own, in and out of place."""
    from mpidp.sim import simulate

    for n in range(2, 9):
        for count in (1, 2, 5):
            for in_place in (False, True):
                inputs = [nan_with_payload(r, count) for r in range(n)]
                out = simulate("allreduce", algorithm, n, count, inputs=inputs,
                               in_place=in_place)
                bits = {y.tobytes() for y in out.results}
                assert len(bits) == 1, (n, count, in_place, [y.view(np.uint64) for y in
                                                             out.results])


# ------------------------------------------ the article's loops and the placed ones agree


def loops_on(q, counts, loop, in_place):
    """Run `loop(rank, buf, blocks, src, tmp)` on q simulated ranks of small-integer inputs
    laid out in blocks of `counts` (in place: src is buf); each rank's buffer afterwards,
    and the inputs."""
    blocks = VirtualBlocks(Blocks(counts), 0)
    inputs = [np.arange(sum(counts), dtype=np.int64) * (rank + 1) % 97 for rank in range(q)]
    bufs = [x.copy() if in_place else np.full(x.size, -1, np.int64) for x in inputs]
    srcs = bufs if in_place else inputs
    tmps = [np.zeros(sum(counts), np.int64) for _ in range(q)]
    Sim(q).run(loop(rank, bufs[rank], blocks, srcs[rank], tmps[rank]) for rank in range(q))
    return bufs, inputs


@pytest.mark.parametrize("q", [1, 2, 4, 8])
def test_the_article_loops_and_the_placed_loops_give_the_same_blocks(q):
    """halving.halving / doubling (partner at distance q/2 first, one message a round) and
    nearest.placed_halving / placed_doubling (any partner order; here the article's and
    two others) leave the same bits, block b reduced on rank b, then every block everywhere:
    counts 0, 1, fewer than q, not divisible by q, and large."""
    article = masks(None, q, 0)
    orders = {article, article[::-1], article[1:] + article[:1]}
    for total, in_place in itertools.product((0, 1, q - 1, 3 * q + 1, 1 << 16), (True, False)):
        if q == 1 and not in_place:
            continue  # one rank: the loops do nothing, the call path copies the input
        counts = Blocks.even(total, q).counts
        rs = {}
        for order in sorted(orders):
            if order == article:
                def rs_loop(rank, buf, blocks, src, tmp):
                    return halving(rank, q, buf, blocks, SUM, tmp, src)
            else:
                def rs_loop(rank, buf, blocks, src, tmp, order=order):
                    return placed_halving(rank, q, buf, blocks, SUM, tmp, src, order, range(q))
            bufs, inputs = loops_on(q, counts, rs_loop, in_place)
            want = sum(inputs)
            spans = [Blocks(counts).span(b, b + 1) for b in range(q)]
            assert all(np.array_equal(bufs[b][spans[b]], want[spans[b]]) for b in range(q)), \
                (total, in_place, order)
            rs[order] = [bufs[b][spans[b]] for b in range(q)]
        assert len({tuple(np.concatenate(v).tolist()) for v in rs.values()}) == 1

        def fill(rank, buf, blocks, src, tmp):  # block `rank` is the rank's own
            buf[blocks.span(rank, rank + 1)] = src[blocks.span(rank, rank + 1)]
            return doubling(rank, q, buf, blocks)

        def fill_placed(rank, buf, blocks, src, tmp):
            buf[blocks.span(rank, rank + 1)] = src[blocks.span(rank, rank + 1)]
            return placed_doubling(rank, q, buf, blocks, article[::-1], range(q))

        for ag in (fill, fill_placed):
            bufs, inputs = loops_on(q, counts, ag, in_place)
            want = np.concatenate([inputs[b][Blocks(counts).span(b, b + 1)] for b in range(q)])
            assert all(np.array_equal(buf, want) for buf in bufs), (total, ag.__name__)


def test_the_article_loop_sends_one_message_a_round_to_rank_xor_mask():
    """The article's exchange: in step i rank r swaps with r ^ (q >> (i + 1)), one half each."""
    q, total = 8, 64
    sim = Sim(q, trace=True)
    blocks = VirtualBlocks(Blocks.even(total, q), 0)
    bufs = [np.ones(total) for _ in range(q)]
    sim.run(halving(r, q, bufs[r], blocks, SUM, np.zeros(total), bufs[r]) for r in range(q))
    assert sim.rounds == [3] * q
    assert sim.bytes_sent == [(32 + 16 + 8) * 8] * q  # half, a quarter, an eighth
    assert sorted((step, src, dst) for step, src, dst, *_ in sim.events) == sorted(
        (step, r, r ^ (q >> (step + 1))) for step in range(3) for r in range(q))


def check_halving(comm):
    check_unknown_algorithm_is_refused(comm)
    check_nan_payloads_agree(comm)
    check_allreduce_matches_mpi_bit_for_bit(comm, HALVING)
    check_allreduce_random_floats_agree_across_ranks(comm, HALVING)
    check_reduce_scatter_matches_mpi(comm)
    check_allgather_matches_mpi(comm)
    with debug_check_off():  # the agreement check's own messages would be counted
        check_volume_and_rounds_match_the_docstrings(comm)
        check_nonblocking_forms_run_concurrently(comm)


# One launch for every N (each launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[8], timeout=300)
def test_halving_doubling_and_the_fold_match_mpi_volume_and_rounds(mpi_ranks):
    on_each_size(SIZES, check_halving)
