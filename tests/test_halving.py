"""Recursive halving / doubling, Rabenseifner, the fold, the trees, direct: checked against MPI.

Every multi-rank test runs for N = 1..8 (powers of two and not) and loops over
ops × dtypes × counts inside one launch. Inputs are small integers, stored in
whatever dtype is tested, so sums, products and averages are exact in every
summation order and results must equal MPI's bit for bit; one random-float
case checks the tolerance that summation order allows.
"""

import numpy as np
import pytest
from mpi4py import MPI
from oracle import (
    DTYPES,
    OPS,
    assert_same,
    make_input,
    native_allreduce,
    native_reduce_scatter,
    valid,
)
from oracle import counts_for as oracle_counts

from mpidp.collectives import CountingComm, api, waitall
from mpidp.collectives.algorithms.halving import fold

RANKS = [1, 2, 3, 4, 5, 6, 7, 8]
ALLREDUCE_ALGOS = ("rabenseifner", "recursive_doubling", "naive", "direct")
LARGE = (4, 7)  # the 1 Mi-item cases run at these N only (one power of two, one not)


def counts_for(n: int) -> list[int]:
    """The oracle's count shapes (0, 1, < N, N, not divisible by N, a prime), and 101."""
    return sorted({*oracle_counts(n), 101})


def dtype_ops():
    """Every (dtype, op) that MPI defines (the oracle's: logical and bitwise ops too)."""
    for dtype in DTYPES:
        for op in OPS:
            if valid(op, dtype):
                yield dtype, op


def combos(n):
    """(dtype, op, count) for every (dtype, op); the counts rotate, each used a dozen times."""
    counts = counts_for(n)
    for i, (dtype, op) in enumerate(dtype_ops()):
        for count in counts[i % 3 :: 3]:
            yield dtype, op, count


def same_on_every_rank(comm, y) -> bool:
    rows = np.empty((comm.Get_size(), y.nbytes), np.uint8)
    comm.Allgather(y.view(np.uint8), rows)
    return bool((rows == rows[0]).all())


def check_allreduce_matches_mpi_bit_for_bit(comm):
    for dtype, op, count in combos(comm.Get_size()):
        x = make_input(op, dtype, count, comm.Get_rank(), seed=100)
        ref = native_allreduce(comm, x, op)
        for algo in ALLREDUCE_ALGOS:
            y = np.full_like(x, 7)
            api.allreduce(comm, x, y, op, algorithm=algo)
            assert_same(y, ref, f"{algo} {dtype} {op} count={count}")
            if dtype != "float64":
                continue
            inplace = x.copy()
            api.allreduce(comm, api.IN_PLACE, inplace, op, algorithm=algo)
            assert_same(inplace, ref, f"{algo} {dtype} {op} count={count} in place")


def check_allreduce_random_floats_agree_across_ranks(comm):
    """Rounding differs from MPI's by summation order only, and every rank gets the same bits."""
    n = comm.Get_size()
    rng = np.random.default_rng(7 + comm.Get_rank())
    for count in (n + 1, 1000, 1 << 20) if n in LARGE else (n + 1, 1000):  # 1 Mi items: 8 MiB
        x = rng.standard_normal(count)
        ref = native_allreduce(comm, x, "sum")
        bound = np.empty_like(x)
        comm.Allreduce(np.abs(x), bound)
        for algo in ALLREDUCE_ALGOS if count < 1 << 20 else ("rabenseifner",):
            for op in ("sum", "avg"):
                y = np.empty_like(x)
                api.allreduce(comm, x, y, op, algorithm=algo)
                # n terms summed in any order: error <= (n-1)·eps·sum|x|
                scale = 1.0 / n if op == "avg" else 1.0
                assert np.all(np.abs(y - ref * scale) <= n * 2.3e-16 * bound * scale), algo
                assert same_on_every_rank(comm, y), (algo, op, count)
    if n not in LARGE:
        return
    big = rng.integers(-3, 3, 1 << 20).astype(np.int32)  # large, exact: every algorithm
    ref = native_allreduce(comm, big, "sum")
    for algo in ALLREDUCE_ALGOS:
        y = np.empty_like(big)
        api.allreduce(comm, big, y, algorithm=algo)
        assert np.array_equal(y, ref), algo


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


def check_bcast_from_every_root(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    for algo in ("binomial", "scatter_allgather"):
        for dtype in (np.uint8, np.float64):
            large = dtype is np.float64 and n in LARGE
            for count in [*counts_for(n), 1 << 20] if large else counts_for(n):
                for root in range(n) if count < 1 << 20 else (n - 1,):
                    want = (np.arange(count) * (root + 1)).astype(dtype)
                    buf = want.copy() if rank == root else np.zeros(count, dtype)
                    api.bcast(comm, buf, root, algorithm=algo)
                    assert np.array_equal(buf, want), (algo, dtype, count, root)


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

def traffic(comm, start):
    """Run a nonblocking collective through a CountingComm: (bytes sent, rounds) of this rank."""
    counter = CountingComm(comm)
    handle = start(counter)
    handle.wait()
    return counter.bytes_sent, handle.rounds


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
    direct:          G(N-1) sent and G(N-1) received, in one round.
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

    # direct: the whole vector to and from every other rank, in one round
    counter = CountingComm(comm)
    handle = api.iallreduce(counter, x, np.empty_like(x), algorithm="direct")
    handle.wait()
    assert counter.bytes_sent == counter.bytes_received == G * (n - 1)
    assert handle.rounds == (1 if n > 1 else 0)

    # naive: a leaf sends G once in the reduce; rank 0 sends G to each of its L children
    L = (n - 1).bit_length()
    sent, rounds = traffic(comm, lambda c: api.iallreduce(c, x, np.empty_like(x),
                                                          algorithm="naive"))
    if rank == 0:
        assert sent == L * G

    # scatter + all-gather broadcast: the root sends G·(n-1)/n in the scatter, + a block
    sent, rounds = traffic(comm, lambda c: api.ibcast(c, x.copy(), 0,
                                                      algorithm="scatter_allgather"))
    if rank == 0 and n > 1:
        assert sent == G * (n - 1) // n + (n - 1) * b


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_unknown_algorithm_is_refused(mpi_ranks):
    x = np.ones(4)
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):
        api.allreduce(MPI.COMM_WORLD, x, np.empty_like(x), algorithm="butterfly")


# One launch per N runs many checks (each mpiexec launch costs seconds).

@pytest.mark.mpi(ranks=RANKS, timeout=300)
def test_allreduce_matches_mpi(mpi_ranks):
    check_allreduce_matches_mpi_bit_for_bit(MPI.COMM_WORLD)
    check_allreduce_random_floats_agree_across_ranks(MPI.COMM_WORLD)


@pytest.mark.mpi(ranks=RANKS, timeout=300)
def test_reduce_scatter_allgather_bcast_match_mpi(mpi_ranks):
    check_reduce_scatter_matches_mpi(MPI.COMM_WORLD)
    check_allgather_matches_mpi(MPI.COMM_WORLD)
    check_bcast_from_every_root(MPI.COMM_WORLD)


@pytest.mark.mpi(ranks=RANKS, timeout=300)
def test_volume_rounds_and_nonblocking_forms(mpi_ranks, no_debug_check):
    check_volume_and_rounds_match_the_docstrings(MPI.COMM_WORLD)
    check_nonblocking_forms_run_concurrently(MPI.COMM_WORLD)
