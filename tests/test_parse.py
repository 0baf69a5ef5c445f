"""mpidp.Comm's errors: the exception mpi4py raises, raised before any message is sent.

Where mpi4py itself rejects an argument, mpidp.Comm raises the same exception
type; where MPI would fail later or compute garbage (derived datatypes, ops
MPI does not define on a dtype, aliased buffers), it raises a clear one. Also:
algorithm names. (Requests that mpi4py's own functions do not take: test_driver.py; a
DLPack-only buffer and a duplicated datatype: test_bufspec.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp


def errors_mpi4py_raises(n: int) -> list:
    """Wrong arguments that mpi4py (or the MPI library, before any message) rejects:
    (what, exception, call)."""
    x, y, t = np.arange(5.0), np.empty(5), MPI.DOUBLE
    read_only = np.empty(5)
    read_only.flags.writeable = False
    cases = [
        ("recvbuf shorter than sendbuf", ValueError, lambda c: c.Allreduce(x, np.empty(4))),
        ("dtypes differ", ValueError, lambda c: c.Allreduce(x, np.empty(5, "f4"))),
        ("a spec of five items", ValueError, lambda c: c.Allreduce(x, [y, 1, 2, 3, 4])),
        ("negative count", ValueError, lambda c: c.Allreduce(x, [y, -1, t])),
        ("displacement past the end", ValueError, lambda c: c.Allreduce(x, [y, (1, 9), t])),
        ("recv count above send count", ValueError, lambda c: c.Allreduce(x, [y, 9, t])),
        ("not a buffer", TypeError, lambda c: c.Allreduce(x, object())),
        ("unknown type code", KeyError, lambda c: c.Allreduce(x, [y, "zz"])),
        ("object dtype (pointers)", KeyError, lambda c: c.Bcast(np.array([1, None], object))),
        ("object dtype, Allgather", KeyError,
         lambda c: c.Allgather(np.array([None], object), np.empty(n, object))),
        ("str dtype", KeyError, lambda c: c.Bcast(np.array(["ab", "cd"]))),
        ("non-native byte order", BufferError, lambda c: c.Bcast(np.zeros(3, ">i4"))),
        ("non-contiguous sendbuf", BufferError, lambda c: c.Allreduce(np.arange(10.0)[::2], y)),
        ("read-only recvbuf", BufferError, lambda c: c.Allreduce(x, read_only)),
        ("IN_PLACE Reduce_scatter without recvcounts", TypeError,
         lambda c: c.Reduce_scatter(MPI.IN_PLACE, np.zeros(n))),
        ("recvcounts of the wrong length", ValueError,
         lambda c: c.Reduce_scatter(np.zeros(n + 1), np.zeros(1), [1] * (n + 1))),
        ("sum(recvcounts) is not the send count", ValueError,
         lambda c: c.Reduce_scatter(np.zeros(n + 1), np.zeros(1), [1] * n)),
        ("recv count is not recvcounts[rank]", ValueError,
         lambda c: c.Reduce_scatter(np.zeros(n), np.zeros(2), [1] * n)),
        ("Reduce_scatter_block blocks differ", ValueError,
         lambda c: c.Reduce_scatter_block(np.zeros(2 * n), np.zeros(3))),
    ]
    if n > 1:
        cases += [
            ("Allgather recvbuf not a multiple of N", ValueError,
             lambda c: c.Allgather(np.zeros(1), np.zeros(n + 1))),
            ("in-place Reduce_scatter_block recvbuf not a multiple of N", ValueError,
             lambda c: c.Reduce_scatter_block(MPI.IN_PLACE, np.zeros(n + 1))),
            # ops on datatypes MPI does not define them on (tests/test_ops.py: all)
            ("MAXLOC of doubles", MPI.Exception, lambda c: c.Allreduce(x, y, op=MPI.MAXLOC)),
            ("MAX of complex numbers", MPI.Exception,
             lambda c: c.Allreduce(np.ones(3, "c16"), np.ones(3, "c16"), op=MPI.MAX)),
            ("SUM of booleans", MPI.Exception,
             lambda c: c.Allreduce(np.ones(3, "?"), np.ones(3, "?"))),
        ]
    return cases


def errors_mpidp_raises(n: int, derived: MPI.Datatype) -> list:
    """Wrong or unsupported arguments that MPI would fail on, or compute garbage with."""
    x, y, t = np.arange(5.0), np.empty(5), MPI.DOUBLE
    return [
        ("derived datatype", NotImplementedError, lambda c: c.Allreduce(x, [y, derived])),
        ("pair datatype", NotImplementedError, lambda c: c.Bcast([np.zeros(4), MPI.DOUBLE_INT])),
        ("MAXLOC of a pair type", NotImplementedError,
         lambda c: c.Allreduce(MPI.IN_PLACE, [np.zeros(4), MPI.DOUBLE_INT], op=MPI.MAXLOC)),
        ("root out of range", ValueError, lambda c: c.Bcast(x, root=n)),
        ("count beyond the buffer", ValueError, lambda c: c.Allreduce(MPI.IN_PLACE, [y, 9, t])),
        ("Allgather send count is not the block", ValueError,
         lambda c: c.Allgather(np.zeros(2), np.zeros(3 * n))),
        ("Allgatherv send count is not recvcounts[rank]", ValueError,
         lambda c: c.Allgatherv(np.zeros(2), [np.zeros(n), [1] * n, t])),
        ("Allgatherv displacement past the end", ValueError,
         lambda c: c.Allgatherv(MPI.IN_PLACE, [np.zeros(n), [1] * n, [n] * n, t])),
        ("the same buffer twice (MPI: aliased)", ValueError, lambda c: c.Allreduce(y, y)),
        ("overlapping buffers", ValueError, lambda c: c.Allgather(y[:1], y[:n])),
        ("unknown per-call algorithm", ValueError,
         lambda c: c.Allreduce(x, y, algorithm="bogus")),
    ]


def expect(error: type, fails, comm, what: str) -> None:
    try:
        fails(comm)
    except error:
        return
    except Exception as e:
        raise AssertionError(f"{comm!r}, {what}: {type(e).__name__}({e}), "
                             f"expected {error.__name__}") from e
    raise AssertionError(f"{comm!r}, {what}: no error, expected {error.__name__}")


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_errors_are_raised_before_any_message(mpi_ranks):
    """N = 1, 3 in one launch (a communicator of each size: tests/helpers/subcomms.py)."""
    on_each_size((1, 3), check_errors_are_raised_before_any_message)


def check_errors_are_raised_before_any_message(world):
    """Same exception as mpi4py where mpi4py raises one; a clear one where MPI would not."""
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.Comm(world)
    for what, error, fails in errors_mpi4py_raises(n):
        for c in (world, comm):
            expect(error, fails, c, what)
    derived = MPI.DOUBLE.Create_contiguous(1).Commit()
    for what, error, fails in errors_mpidp_raises(n, derived):
        expect(error, fails, comm, what)
    derived.Free()
    # debug=True: ranks that disagree on the count all raise, and say what each passed
    if n > 1:
        checked = mpidp.Comm(world, debug=True)
        with pytest.raises(ValueError, match="disagree"):
            checked.Allreduce(np.ones(rank + 1), np.empty(rank + 1))
        x = np.ones(3)
        checked.Allreduce(MPI.IN_PLACE, x)
        assert (x == n).all()
    # nothing was sent by a failed call, and the Comm still works
    world.Barrier()
    pending = world.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    world.Barrier()  # no rank starts the next collective (and sends) before all have looked
    assert not pending
    x = np.full(3, rank, "i")
    comm.Allreduce(MPI.IN_PLACE, x)
    assert (x == n * (n - 1) // 2).all()


def test_unknown_algorithm_names_the_valid_ones():
    world = MPI.COMM_WORLD
    for algorithm in ("ring", "auto", *(n for names in mpidp.ALGORITHMS.values() for n in names)):
        mpidp.Comm(world, algorithm=algorithm)
    mpidp.Comm(world, algorithm={c: names[0] for c, names in mpidp.ALGORITHMS.items()})
    with pytest.raises(ValueError) as info:
        mpidp.Comm(world, algorithm="fastest")
    for names in mpidp.ALGORITHMS.values():
        assert all(repr(name) in str(info.value) for name in names)
    with pytest.raises(ValueError, match="collective"):
        mpidp.Comm(world, algorithm={"alltoall": "ring"})
    with pytest.raises(ValueError, match="bcast"):
        mpidp.Comm(world, algorithm={"bcast": "ring"})
    with pytest.raises(TypeError):
        mpidp.Comm(world, algorithm=3)
    with pytest.raises(ValueError):
        mpidp.Comm(MPI.COMM_NULL)
