"""Bad input raises a clear exception before any message is sent, on the rank that got it."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import mpidp


def _no_traffic(call):
    """Run `call(comm)` on a counting comm; return the exception, asserting nothing was sent."""
    comm = mpidp.CountingComm(MPI.COMM_WORLD)
    with pytest.raises(Exception) as info:
        call(comm)
    assert comm.messages_sent == 0 and comm.bytes_received == 0, "sent before checking"
    return info.value


BAD = {
    "dtype mismatch": (lambda c: mpidp.allreduce(c, np.ones(4), np.ones(4, np.float32)),
                       TypeError, "same dtype"),
    "size mismatch": (lambda c: mpidp.allreduce(c, np.ones(4), np.ones(5)),
                      ValueError, "items"),
    "non-contiguous": (lambda c: mpidp.allreduce(c, np.ones(8)[::2], np.ones(4)),
                       ValueError, "contiguous"),
    "read-only recvbuf": (lambda c: mpidp.allreduce(c, np.ones(4), _readonly(4)),
                          ValueError, "read-only"),
    "unknown op": (lambda c: mpidp.allreduce(c, np.ones(4), np.ones(4), op="mean"),
                   ValueError, "unknown op"),
    "max on complex": (lambda c: mpidp.allreduce(c, np.ones(4, complex), np.ones(4, complex),
                                                 op="max"), TypeError, "complex"),
    "unknown algorithm": (lambda c: mpidp.allreduce(c, np.ones(4), np.ones(4),
                                                    algorithm="butterfly"),
                          ValueError, "unknown allreduce algorithm"),
    "not an array": (lambda c: mpidp.allreduce(c, array.array("d", [1.0]), np.ones(1)),
                     TypeError, "NumPy or CuPy"),
    "aliased buffers": (lambda c: _aliased(c), ValueError, "IN_PLACE"),
    "bad root": (lambda c: mpidp.bcast(c, np.ones(3), root=99), ValueError, "root"),
    "recvcounts length": (lambda c: mpidp.reduce_scatter(c, np.ones(4), np.ones(4), [4]
                                                         * (c.Get_size() + 1)),
                          ValueError, "recvcounts"),
    "allgather recv too small": (lambda c: mpidp.allgather(c, np.ones(3),
                                                           np.ones(3 * c.Get_size() - 1)),
                                 ValueError, "blocks need"),
    "bcast of Python objects": (lambda c: mpidp.bcast(c, np.array([1, None], object)),
                                TypeError, "Python objects"),
    "allgather of Python objects": (lambda c: mpidp.allgather(
        c, np.array([None], object), np.empty(c.Get_size(), object)), TypeError, "pointers"),
    "sum of strings": (lambda c: mpidp.allreduce(c, np.array(["a"]), np.array(["b"])),
                       TypeError, "not defined"),
    "tag in mpidp's range": (lambda c: mpidp.allreduce(c, np.ones(4), np.ones(4),
                                                       tag=mpidp.TAG_BASE + 1),
                             ValueError, "explicit tag"),
    "DataParallel of object parameters": (lambda c: _object_model(c), TypeError, "objects"),
}


def _object_model(comm):
    model = mpidp.MLP([3, 2], seed=0)
    model.params["W1"] = np.array([[None] * 2] * 3, dtype=object)
    mpidp.DataParallel(model, comm)


def _readonly(n):
    a = np.ones(n)
    a.flags.writeable = False
    return a


def _aliased(comm):
    a = np.ones(8)
    mpidp.allreduce(comm, a[:4], a[2:6])


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_communication(case):
    call, exc_type, text = BAD[case]
    err = _no_traffic(call)
    assert isinstance(err, exc_type), f"{case}: {type(err).__name__}: {err}"
    assert text in str(err), f"{case}: message {err!r} lacks {text!r}"


@pytest.mark.mpi(ranks=[3], timeout=60)
def test_bad_input_is_refused_before_communication_on_3_ranks(mpi_ranks):
    """The same table where the algorithms would send: nothing leaves any rank."""
    for case, (call, exc_type, text) in sorted(BAD.items()):
        err = _no_traffic(call)
        assert isinstance(err, exc_type) and text in str(err), f"{case}: {err!r}"
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(ranks=[2, 3, 4], timeout=60)
def test_bad_input_on_one_rank_raises_there(mpi_ranks):
    """Only rank 1 passes a bad buffer: it raises at once; nothing reaches any other rank."""
    world = MPI.COMM_WORLD
    comm = mpidp.CountingComm(world)
    if comm.rank == 1:
        with pytest.raises(ValueError, match="contiguous"):
            mpidp.allreduce(comm, np.ones(8)[::2], np.ones(4))
        with pytest.raises(TypeError, match="Python objects"):
            mpidp.bcast(comm, np.array([None] * 3, dtype=object), root=1)
    world.Barrier()  # anything rank 1 had sent would have left it by now
    assert comm.messages_sent == 0 and comm.bytes_received == 0, "a rank sent or received"
    assert not world.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG), "a message arrived from rank 1"
    world.Barrier()


@pytest.mark.mpi(ranks=[2, 3, 5], timeout=60)
def test_debug_mode_catches_ranks_that_disagree(mpi_ranks):
    """Mismatched counts are detected on every rank, with what each rank passed."""
    comm = MPI.COMM_WORLD
    count = 10 + (comm.rank == comm.size - 1)  # the last rank disagrees
    x = np.ones(count)
    with pytest.raises(ValueError, match="ranks disagree") as info:
        mpidp.allreduce(comm, x, np.empty_like(x), debug=True)
    assert f"rank {comm.size - 1}:" in str(info.value)
    with pytest.raises(ValueError, match="ranks disagree"):
        mpidp.bcast(comm, np.ones(4), root=comm.rank % 2, debug=True)
    # agreeing ranks pass the check and get the right answer
    y = np.empty(10)
    mpidp.allreduce(comm, np.ones(10), y, debug=True)
    assert np.array_equal(y, np.full(10, comm.size))
