"""Persistent collectives (``*_init``): planned once, started many times, checked against MPI.

Each persistent collective is started three times with new data in its buffers
(the plan holds views of them), and every result is compared with the MPI
library's own on the same inputs, for every algorithm and every count shape, on 1 to 8
ranks: every rank count in one launch of 8 ranks (a communicator of each size:
tests/helpers/subcomms.py).
"""

import numpy as np
import pytest
from helpers.oracle import (
    assert_same,
    counts_for,
    make_input,
    native_allgather,
    native_allreduce,
    native_reduce_scatter,
)
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives import state
from mpidp.collectives.algorithms.blocks import Blocks

STARTS = 3


def check_allreduce(comm, wrapped, count: int, algorithm: str, in_place: bool) -> None:
    x, y = np.empty(count, np.int64), np.empty(count, np.int64)
    if wrapped:
        req = mpidp.Comm(comm).Allreduce_init(MPI.IN_PLACE if in_place else x, y,
                                              algorithm=algorithm)
    else:
        req = mpidp.allreduce_init(comm, mpidp.IN_PLACE if in_place else x, y,
                                   algorithm=algorithm)
    for start in range(STARTS):
        x[...] = make_input("sum", "int64", count, comm.Get_rank(), seed=start)
        if in_place:
            y[...] = x
        req.Start()
        req.Wait()
        assert_same(y, native_allreduce(comm, x, "sum"),
                    f"allreduce {algorithm} count={count} start={start} in_place={in_place}")
    req.Free()


def check_reduce_scatter(comm, count: int, algorithm: str) -> None:
    n, rank = comm.Get_size(), comm.Get_rank()
    blocks = Blocks.even(count, n)
    x, y = np.empty(count, np.int32), np.full(blocks.counts[rank], -1, np.int32)
    req = mpidp.reduce_scatter_init(comm, x, y, list(blocks.counts), op="max",
                                    algorithm=algorithm)
    for start in range(STARTS):
        x[...] = make_input("max", "int32", count, rank, seed=start)
        req.Start()
        req.Wait()
        assert_same(y, native_reduce_scatter(comm, x, blocks.counts, "max"),
                    f"reduce_scatter {algorithm} count={count} start={start}")
    req.Free()


def check_allgather(comm, count: int, algorithm: str) -> None:
    n, rank = comm.Get_size(), comm.Get_rank()
    blocks = Blocks.even(count, n)
    mine, y = np.empty(blocks.counts[rank], np.float64), np.empty(count, np.float64)
    req = mpidp.allgatherv_init(comm, mine, y, list(blocks.counts), algorithm=algorithm)
    for start in range(STARTS):
        mine[...] = make_input("sum", "float64", blocks.counts[rank], rank, seed=start)
        req.Start()
        req.Wait()
        assert_same(y, native_allgather(comm, mine, blocks.counts),
                    f"allgather {algorithm} count={count} start={start}")
    req.Free()


def check_bcast(comm, count: int, algorithm: str) -> None:
    n, rank = comm.Get_size(), comm.Get_rank()
    root = count % n
    buf = np.empty(count, np.uint8)
    req = mpidp.bcast_init(comm, buf, root, algorithm=algorithm)
    for start in range(STARTS):
        want = make_input("sum", "uint8", count, root, seed=start)
        buf[...] = want if rank == root else 0
        req.Start()
        req.Wait()
        assert_same(buf, want, f"bcast {algorithm} count={count} start={start}")
    req.Free()


def check_start_after_start(comm):
    n = comm.Get_size()
    for count in counts_for(n) + ([100_003] if n in (3, 4) else []):
        for algorithm in mpidp.ALGORITHMS["allreduce"]:
            check_allreduce(comm, wrapped=algorithm == "auto", count=count,
                            algorithm=algorithm, in_place=count % 2 == 0)
        for algorithm in mpidp.ALGORITHMS["reduce_scatter"]:
            check_reduce_scatter(comm, count, algorithm)
        for algorithm in mpidp.ALGORITHMS["allgather"]:
            check_allgather(comm, count, algorithm)
        for algorithm in mpidp.ALGORITHMS["bcast"]:
            check_bcast(comm, count, algorithm)
    assert not state.state(comm)._held, "a freed persistent collective still holds its tag"


def check_starting_never_moves_the_sequence(world):
    comm = world.Dup()
    st = state.state(comm)
    n = comm.Get_size()
    x, y, w = np.arange(4.0 * n), np.empty(4 * n), np.empty(4)
    req = mpidp.allreduce_init(comm, x, y, algorithm="ring")
    other = mpidp.Comm(comm).Reduce_scatter_block_init(x, w, algorithm="ring")
    created = st.started
    z = np.empty_like(x)
    for _ in range(5):
        req.Start()
        other.Start()
        plain = mpidp.iallreduce(comm, x, z, algorithm="ring")  # in flight alongside
        mpidp.waitall([plain, other, req])  # in an order of its own
        assert np.array_equal(y, n * x) and np.array_equal(z, n * x)
        assert np.array_equal(w, n * x[4 * comm.Get_rank():][:4])
    assert st.started == created + 5  # only the plain all-reduces took numbers
    assert req.done and req.Test() and req.Wait()  # complete: inactive
    with pytest.raises(RuntimeError, match="still active"):
        req.Start()
        req.Start()
    req.Wait()
    req.Free()
    other.Free()
    with pytest.raises(RuntimeError, match="freed"):
        req.Start()
    assert not st._held
    comm.Free()


# Both in one launch (a launch of 8 ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[8], timeout=240)
def test_persistent_collectives_match_mpi_and_never_move_the_sequence(mpi_ranks):
    """Start after start against MPI (N = 1..8); starting never takes a number of the
    sequence, with plain calls in flight alongside (N = 2, 3)."""
    on_each_size(range(1, 9), check_start_after_start)
    on_each_size((2, 3), check_starting_never_moves_the_sequence)


def test_a_persistent_collective_on_one_rank():
    comm = MPI.COMM_SELF
    x, y = np.arange(5.0), np.zeros(5)
    req = mpidp.allreduce_init(comm, x, y)
    assert req.Test() and req.Wait()  # never started: inactive
    mpidp.Persistent.Startall([req])
    req.Wait()
    assert np.array_equal(y, x)
    x += 1
    req.Start()
    req.Wait()
    assert np.array_equal(y, x)  # the copy belongs to every run, not to the planning
    req.Free()
