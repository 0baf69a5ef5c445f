"""Ring collectives against the MPI library's own results, for N = 1..8.

All rank counts in one launch of 8 ranks (a communicator of each size:
tests/helpers/subcomms.py); for each, every op x dtype x count, blocking and
nonblocking, in place and out of place. The oracle is the MPI library's own
Allreduce / Reduce_scatter / Allgatherv on the same communicator and inputs.

Last, the article's volume claim, asserted with a byte-counting communicator.
All-reduce = reduce-scatter + all-gather: with G bytes on each of N ranks, each
rank sends G(N-1)/N in each half, D = 2·G·(N-1)/N in all, in 2(N-1) rounds.
"""

import os

import numpy as np
import pytest
from helpers.oracle import (
    DTYPES,
    OPS,
    assert_same,
    counts_for,
    make_input,
    native_allgather,
    native_allreduce,
    native_reduce_scatter,
    valid,
)
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from mpi4py import MPI

import mpidp
from mpidp.collectives.algorithms.blocks import Blocks

SIZES = range(1, 9)
LARGE_SIZES = (2, 3, 4, 7)  # the 1 Mi-item buffers: a few N, powers of two and not


def _drive(handle):
    """Complete a nonblocking collective by polling, as the trainer does (yielding the core
    between polls, as mpidp's own waits do: 8 ranks share 2 cores, and a rank that spins
    takes the time slice its peers need to move the ring on)."""
    while not handle.test():
        os.sched_yield()


def rotated(counts: list[int], i: int, k: int = 3) -> list[int]:
    """The `i`-th case's share of `counts`: every k-th from i % k, so that the cases
    together try each count many times (the suite's time: every case at every count
    and N was 3x this launch's)."""
    return counts[i % k::k]


def check_allreduce_matches_mpi(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    checked = 0
    pairs = [(op, dtype) for op in OPS for dtype in DTYPES if valid(op, dtype)]
    for i, (op, dtype) in enumerate(pairs):
        for count in rotated(counts_for(n), i):
            x = make_input(op, dtype, count, rank)
            want = native_allreduce(comm, x, op)
            what = f"allreduce op={op} dtype={dtype} count={count} n={n}"
            # out of place, blocking
            y = np.full_like(x, 7)
            mpidp.allreduce(comm, x, y, op=op, algorithm="ring")
            assert_same(y, want, what + " out-of-place")
            # in place, nonblocking
            z = x.copy()
            _drive(mpidp.iallreduce(comm, mpidp.IN_PLACE, z, op=op, algorithm="ring"))
            assert_same(z, want, what + " in-place nonblocking")
            checked += 1
    assert checked >= len(pairs) * len(counts_for(n)) // 3  # every pair, a third of counts


def check_reduce_scatter_matches_mpi(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    pairs = [(op, dtype) for op in ("sum", "prod", "max", "min", "avg", "bxor")
             for dtype in DTYPES if valid(op, dtype)]
    for i, (op, dtype) in enumerate(pairs):
        for count in rotated(counts_for(n), i):
            what = f"reduce_scatter op={op} dtype={dtype} count={count} n={n}"
            # equal blocks (Reduce_scatter_block): count items per rank
            x = make_input(op, dtype, count * n, rank)
            want = native_reduce_scatter(comm, x, [count] * n, op)
            y = np.zeros(count, dtype=dtype)
            mpidp.reduce_scatter(comm, x, y, op=op, algorithm="ring")
            assert_same(y, want, what + " block")
            # per-rank counts (Reduce_scatter): uneven, some empty
            counts = [(count + 3 * r) % (n + 2) for r in range(n)]
            x = make_input(op, dtype, sum(counts), rank, seed=1)
            want = native_reduce_scatter(comm, x, counts, op)
            y = np.zeros(counts[rank], dtype=dtype)
            _drive(mpidp.ireduce_scatter(comm, x, y, counts, op=op, algorithm="ring"))
            assert_same(y, want, what + f" counts={counts}")
            # in place: the input is in recvbuf, the result lands at its start
            x = make_input(op, dtype, sum(counts), rank, seed=1)
            mpidp.reduce_scatter(comm, mpidp.IN_PLACE, x, counts, op=op, algorithm="ring")
            assert_same(x[: counts[rank]], want, what + " in-place")


def check_allgather_matches_mpi(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    for i, dtype in enumerate(DTYPES + ["bool"]):
        for count in rotated(counts_for(n), i, 2):
            what = f"allgather dtype={dtype} count={count} n={n}"
            x = make_input("sum", "int64", count, rank).astype(dtype)
            want = native_allgather(comm, x, [count] * n)
            y = np.zeros(count * n, dtype=dtype)
            mpidp.allgather(comm, x, y, algorithm="ring")
            assert_same(y, want, what)
            # Allgatherv: per-rank counts
            counts = [(count + r) % 4 for r in range(n)]
            x = make_input("sum", "int64", counts[rank], rank).astype(dtype)
            want = native_allgather(comm, x, counts)
            y = np.zeros(sum(counts), dtype=dtype)
            _drive(mpidp.iallgather(comm, x, y, counts, algorithm="ring"))
            assert_same(y, want, what + f" counts={counts}")
            # in place, with gaps between the blocks (explicit displacements)
            displs = [sum(counts[:r]) + 2 * r for r in range(n)]
            z = np.zeros(sum(counts) + 2 * n, dtype=dtype)
            Blocks(counts, displs).view(z, rank)[...] = x
            mpidp.allgather(comm, mpidp.IN_PLACE, z, counts, displs, algorithm="ring")
            for r in range(n):
                assert_same(Blocks(counts, displs).view(z, r), Blocks(counts).view(want, r),
                            what + f" in-place block {r}")


def check_large_buffers(comm):
    """≥ 1 Mi items: random floats (tolerance from summation order) and exact integers."""
    n, rank = comm.Get_size(), comm.Get_rank()
    count = (1 << 20) + 3  # not divisible by N
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(count)
    want = native_allreduce(comm, x, "sum")
    y = np.empty_like(x)
    mpidp.allreduce(comm, x, y, algorithm="ring")
    # N terms summed in another order: each partial sum rounds once per term
    np.testing.assert_allclose(y, want, rtol=n * np.finfo(np.float64).eps * 4, atol=1e-12)
    xi = rng.integers(-(2**20), 2**20, size=count).astype(np.int64)
    yi = np.empty_like(xi)
    mpidp.allreduce(comm, xi, yi, op=MPI.MAX, algorithm="ring")
    assert_same(yi, native_allreduce(comm, xi, "max"), "large int64 max")
    # every rank holds the same bits (what keeps DP replicas identical)
    root_copy = y.copy()
    comm.Bcast(root_copy, root=0)
    assert np.array_equal(y.view(np.uint64), root_copy.view(np.uint64))


def check_sends_2G_N_minus_1_over_N(world):
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.CountingComm(world)
    for count in (840, 1000, 7, 0):  # 840 is divisible by 1..8; the others mostly not
        x = np.ones(count, dtype=np.float32)
        G = x.nbytes
        blocks = Blocks.even(count, n)
        mine, right = blocks.counts[rank], blocks.counts[(rank + 1) % n]
        item = x.itemsize

        comm.reset()
        h = mpidp.iallreduce(comm, x, np.empty_like(x), algorithm="ring")
        h.wait()
        # reduce-scatter sends every block but mine; all-gather every block but my right's
        exact = (2 * count - mine - right) * item
        assert comm.bytes_sent == exact
        if count and count % n == 0:
            assert comm.bytes_sent == 2 * G * (n - 1) / n
        assert h.rounds == (2 * (n - 1) if count else 0)
        assert comm.messages_sent == h.rounds
        assert comm.peers <= {(rank + 1) % n}  # a ring: only ever to the right

        comm.reset()
        h = mpidp.ireduce_scatter(comm, np.ones(count * n, np.float32),
                                  np.empty(count, np.float32), algorithm="ring")
        h.wait()
        assert comm.bytes_sent == count * item * (n - 1) == count * n * item * (n - 1) / n
        assert h.rounds == n - 1

        comm.reset()
        h = mpidp.iallgather(comm, x, np.empty(count * n, np.float32), algorithm="ring")
        h.wait()
        assert comm.bytes_sent == count * item * (n - 1)
        assert h.rounds == n - 1


def check_ring_matches_mpi(comm):
    check_allreduce_matches_mpi(comm)
    check_reduce_scatter_matches_mpi(comm)
    check_allgather_matches_mpi(comm)


def check_large_buffers_and_volume(comm):
    if comm.Get_size() in LARGE_SIZES:
        check_large_buffers(comm)
    with debug_check_off():  # the agreement check's own messages would be counted
        check_sends_2G_N_minus_1_over_N(comm)


# One launch each (a launch of 8 ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[8], timeout=300)
def test_ring_allreduce_reduce_scatter_allgather_match_mpi(mpi_ranks):
    on_each_size(SIZES, check_ring_matches_mpi)


@pytest.mark.mpi(ranks=[8], timeout=300)
def test_ring_large_buffers_and_the_articles_volume(mpi_ranks):
    on_each_size(SIZES, check_large_buffers_and_volume)
