"""Bad input raises a clear exception before any message is sent, on the rank that got it."""

import array

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives import checks


def _no_traffic(call, base=None):
    """Run `call(comm)` on a counting comm over `base` (default ``MPI.COMM_WORLD``); return
    the exception, asserting nothing was sent."""
    comm = mpidp.CountingComm(MPI.COMM_WORLD if base is None else base)
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
    # an integer argument given as a float: a TypeError naming it (root=1.0 used to fail in
    # the middle of the broadcast, "unsupported operand type(s) for &", and keep its slot)
    "float root": (lambda c: mpidp.bcast(c, np.ones(3), root=0.0), TypeError, "root=0.0"),
    "float root, I-form": (lambda c: mpidp.ibcast(c, np.ones(3), root=0.0), TypeError, "root"),
    "float root, persistent": (lambda c: mpidp.bcast_init(c, np.ones(3), root=0.0), TypeError,
                               "root"),
    "float root, mpidp.Comm": (lambda c: mpidp.Comm(c).Bcast(np.ones(3), root=0.0), TypeError,
                               "root"),
    "float recvcounts": (lambda c: mpidp.reduce_scatter(c, np.ones(c.Get_size()), np.ones(1),
                                                        [1.0] * c.Get_size()),
                         TypeError, "recvcounts"),
    "float displs": (lambda c: mpidp.allgather(c, np.ones(1), np.ones(c.Get_size()),
                                               [1] * c.Get_size(),
                                               [float(r) for r in range(c.Get_size())]),
                     TypeError, "displs"),
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


def check_bad_input_is_refused_before_communication(world):
    """The same table where the algorithms would send: nothing leaves any rank."""
    for case, (call, exc_type, text) in sorted(BAD.items()):
        err = _no_traffic(call, world)
        assert isinstance(err, exc_type) and text in str(err), f"{case}: {err!r}"
    world.Barrier()


def check_bad_input_on_one_rank_raises_there(world):
    """Only rank 1 passes a bad buffer: it raises at once; nothing reaches any other rank."""
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


def check_debug_mode_catches_ranks_that_disagree(comm):
    """Mismatched counts are detected on every rank, with what each rank passed."""
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


# ---------------------------------------------------------------- intercommunicators

def _intercomm_calls(n_remote: int) -> dict:
    """Every function, I-form and ``*_init`` on an intercommunicator (`n_remote`: the other
    group's size, which the counts of MPI's intercommunicator collectives would follow)."""
    x, y = np.ones(4), np.empty(4)
    many = np.empty(4 * n_remote)
    counts = [4] * n_remote
    return {
        "allreduce": lambda c: mpidp.allreduce(c, x, y),
        "iallreduce": lambda c: mpidp.iallreduce(c, x, y),
        "allreduce in place": lambda c: mpidp.allreduce(c, mpidp.IN_PLACE, y),
        "allreduce with a tag": lambda c: mpidp.allreduce(c, x, y, tag=7),
        "reduce_scatter": lambda c: mpidp.reduce_scatter(c, many, y),
        "ireduce_scatter": lambda c: mpidp.ireduce_scatter(c, many, y, counts),
        "allgather": lambda c: mpidp.allgather(c, x, many),
        "iallgather": lambda c: mpidp.iallgather(c, x, many, counts),
        "bcast": lambda c: mpidp.bcast(c, y, root=0),
        "ibcast": lambda c: mpidp.ibcast(c, y, root=0),
        "allreduce_init": lambda c: mpidp.allreduce_init(c, x, y),
        "reduce_scatter_init": lambda c: mpidp.reduce_scatter_init(c, many, y, counts),
        "reduce_scatter_block_init": lambda c: mpidp.reduce_scatter_block_init(c, many, y),
        "allgather_init": lambda c: mpidp.allgather_init(c, x, many),
        "allgatherv_init": lambda c: mpidp.allgatherv_init(c, x, many, counts),
        "bcast_init": lambda c: mpidp.bcast_init(c, y, root=0),
        "DataParallel": lambda c: mpidp.DataParallel(mpidp.MLP([3, 2], seed=0), c),
        "mpidp.Comm": lambda c: mpidp.Comm(c),
    }


def check_intercommunicators_are_refused_before_any_message(world):
    """MPI's collectives on an intercommunicator reduce or gather the *other* group's data;
    mpidp's algorithms know one group only, so every entry point refuses one, before
    any message (they used to return this group's result: wrong values, exit 0)."""
    color = world.rank % 2  # two groups; with 3 ranks of sizes 2 and 1
    local = world.Split(color, world.rank)
    inter = local.Create_intercomm(0, world, 1 - color, tag=12)
    assert inter.Is_inter()
    for case, call in sorted(_intercomm_calls(inter.Get_remote_size()).items()):
        comm = mpidp.CountingComm(inter)
        with pytest.raises(NotImplementedError, match="intercommunicator") as info:
            call(inter)
        with pytest.raises(NotImplementedError, match="intercommunicator"):
            call(comm)  # through a comm-like object that wraps one
        assert comm.messages_sent == 0 and comm.bytes_received == 0, case
        assert "Merge" in str(info.value), f"{case}: {info.value}"  # what to do instead
    world.Barrier()  # anything sent would have left its rank by now
    assert not inter.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG), "a message crossed the intercomm"
    assert not world.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
    # the group's own intracommunicator still works
    y = np.empty(3)
    mpidp.allreduce(local, np.ones(3), y)
    assert np.array_equal(y, np.full(3, local.Get_size()))
    inter.Free()
    local.Free()


# ---------------------------------------------------------------- integer arguments

def check_integer_like_arguments_are_the_same_call_as_ints(world):
    """``root=np.int64(1)`` on some ranks and ``root=1`` on the others is the same call,
    as in MPI: it completes (it used to stall, its signature hashing ``repr(root)``, or,
    with MPIDP_DEBUG=1, raise that the ranks disagree). The same for counts and displs."""
    n, rank = world.Get_size(), world.Get_rank()
    odd = rank % 2
    as_given = (lambda v: np.int64(v)) if odd else (lambda v: v)
    as_list = (lambda vs: np.array(vs, dtype=np.int64)) if odd else list
    before = checks.debug_enabled()
    for debug in (True, False):
        checks.set_debug(debug)
        try:
            comm = world.Dup()  # a stall here cannot meet the next case's messages
            want = np.arange(5.0) + 1
            y = want.copy() if rank == 1 else np.zeros(5)
            mpidp.ibcast(comm, y, root=as_given(1), algorithm="binomial").wait(timeout=10)
            assert np.array_equal(y, want), (debug, y)
            y = want.copy() if rank == 1 else np.zeros(5)
            mpidp.Comm(comm).Ibcast(y, root=as_given(1)).wait(timeout=10)
            assert np.array_equal(y, want), (debug, y)
            req = mpidp.bcast_init(comm, y, root=as_given(1))
            req.Start()
            req.wait(timeout=10)
            req.Free()
            counts = [2 + r for r in range(n)]
            got = np.zeros(counts[rank])
            mpidp.ireduce_scatter(comm, np.ones(sum(counts)), got, as_list(counts)).wait(10)
            assert np.array_equal(got, np.full(counts[rank], float(n)))
            displs = [sum(counts[:r]) for r in range(n)]
            out = np.zeros(sum(counts))
            mpidp.iallgather(comm, np.full(counts[rank], float(rank)), out, as_list(counts),
                             as_list(displs)).wait(timeout=10)
            assert np.array_equal(out, np.repeat(np.arange(n, dtype=float), counts))
            x, y = np.ones(3), np.zeros(3)
            mpidp.iallreduce(comm, x, y, tag=as_given(5)).wait(timeout=10)
            assert np.array_equal(y, np.full(3, float(n)))
            comm.Free()
        finally:
            checks.set_debug(before)


# Every multi-rank check in one launch (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[5], timeout=120)
def test_bad_input_disagreeing_ranks_intercommunicators_and_integer_likes_on_real_ranks(
        mpi_ranks):
    """The bad-input table where the algorithms would send (N = 3); bad input on one rank
    raises there (N = 2, 3, 4); debug mode catches ranks that disagree (N = 2, 3, 5);
    intercommunicators are refused before any message, and integer-like arguments are the
    same call as ints (N = 2, 3)."""
    on_each_size((3,), check_bad_input_is_refused_before_communication)
    on_each_size((2, 3, 4), check_bad_input_on_one_rank_raises_there)
    on_each_size((2, 3, 5), check_debug_mode_catches_ranks_that_disagree)
    on_each_size((2, 3), check_intercommunicators_are_refused_before_any_message)
    on_each_size((2, 3), check_integer_like_arguments_are_the_same_call_as_ints)
