"""Ring collectives against the MPI library's own results, for N = 1..8.

One job per rank count; inside it, every op x dtype x count, blocking and
nonblocking, in place and out of place. The oracle is MPI.COMM_WORLD's
Allreduce / Reduce_scatter / Allgatherv on the same inputs.
"""

import numpy as np
import pytest
from mpi4py import MPI
from oracle import (
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

import mpidp
from mpidp.collectives.algorithms.blocks import Blocks

RANKS = [1, 2, 3, 4, 5, 6, 7, 8]


def _drive(handle):
    """Complete a nonblocking collective by polling, as the trainer does."""
    while not handle.test():
        pass


@pytest.mark.mpi(ranks=RANKS, timeout=150)
def test_ring_allreduce_matches_mpi(mpi_ranks):
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    checked = 0
    for op in OPS:
        for dtype in DTYPES:
            if not valid(op, dtype):
                continue
            for count in counts_for(n):
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
    assert checked > 100


@pytest.mark.mpi(ranks=RANKS, timeout=150)
def test_ring_reduce_scatter_matches_mpi(mpi_ranks):
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    for op in ("sum", "prod", "max", "min", "avg", "bxor"):
        for dtype in DTYPES:
            if not valid(op, dtype):
                continue
            for count in counts_for(n):
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


@pytest.mark.mpi(ranks=RANKS, timeout=150)
def test_ring_allgather_matches_mpi(mpi_ranks):
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    for dtype in DTYPES + ["bool"]:
        for count in counts_for(n):
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


@pytest.mark.mpi(ranks=[2, 3, 4, 7], timeout=150)
def test_ring_large_buffers(mpi_ranks):
    """≥ 1 Mi items: random floats (tolerance from summation order) and exact integers."""
    comm = MPI.COMM_WORLD
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
