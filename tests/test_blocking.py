"""Blocking calls replayed from a recorded schedule (mpidp/collectives/blocking.py).

What a replay must keep: the MPI library's results on the same inputs (every rank count 1
to 8; counts 0, 1, below N, not divisible by N, and up to and past the all-reduce's size
limit), the planned path's bits, the sequence (one slot a call), the checks of bad arrays,
the flight record, and the wire: a rank that replays and a rank that plans meet. The suite
runs with MPIDP_DEBUG=1, under which nothing replays: these tests turn it off.
"""

import numpy as np
import pytest
from helpers.oracle import OPS as MPI_OPS
from helpers.oracle import (
    assert_same,
    counts_for,
    make_input,
    native_allgather,
    native_allreduce,
)
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp import flight
from mpidp.collectives import blocking, checks, schedules, state
from mpidp.collectives.algorithms import REGISTRY, Algorithm, register, unregister
from mpidp.collectives.algorithms.blocks import one_vector
from mpidp.collectives.algorithms.rounds import Recv, Send
from mpidp.collectives.cost import set_model

CALLS = 3  # the first is planned and recorded, the others replay
ALLREDUCE = ("auto", "ring", "rabenseifner", "recursive_doubling", "naive")
ALLGATHER = ("auto", "ring", "recursive_doubling")
BCAST = ("auto", "binomial", "scatter_allgather")


def one_slot_each(comm, seed: int, started: int, what: str) -> None:
    """One slot a call, as a planned call (the first may calibrate auto's model: more)."""
    if seed:
        assert state.state(comm).started == started + 1, what


def replayed(comm, key: tuple) -> bool:
    return isinstance(state.state(comm).schedules.get(key), blocking.Schedule)


def setup_of(comm, key: tuple):
    return state.state(comm).setups[key].algo


def allreduces(comm, op: str, dtype: str, count: int, algorithm: str, in_place: bool,
               wrapped: bool = False) -> None:
    """`CALLS` all-reduces with new inputs, through `mpidp.allreduce` or `mpidp.Comm`."""
    y = np.empty(count, dtype)
    allreduce = mpidp.Comm(comm, algorithm).Allreduce if wrapped else \
        lambda send, recv, op: mpidp.allreduce(comm, send, recv, op=op, algorithm=algorithm)
    for seed in range(CALLS):
        x = make_input(op, dtype, count, comm.Get_rank(), seed)
        started = state.state(comm).started
        if in_place:
            y[...] = x
            allreduce(MPI.IN_PLACE, y, op=MPI_OPS[op] if wrapped else op)
        else:
            y[...] = -7
            allreduce(x, y, op=MPI_OPS[op] if wrapped else op)
        what = (f"{op} {dtype} n={comm.Get_size()} count={count} {algorithm} "
                f"in_place={in_place} wrapped={wrapped} call {seed}")
        one_slot_each(comm, seed, started, what)
        assert_same(y, native_allreduce(comm, x, op), what)


def check_allreduce(comm) -> None:
    n = comm.Get_size()
    cases = [("sum", "int64"), ("max", "int32"), ("prod", "float64"), ("avg", "float32"),
             ("sum", "float16"), ("avg", "float16")]
    limit = schedules.REDUCE_BYTES // 8
    for op, dtype in cases:
        for count in counts_for(n) + ([limit, limit + 1] if dtype == "int64" else []):
            for algorithm in ALLREDUCE:
                for in_place in (True, False):
                    allreduces(comm, op, dtype, count, algorithm, in_place)
                    key = ("allreduce", count, np.dtype(dtype), op, algorithm,
                           None if in_place else np.dtype(dtype), "api")
                    if n == 1 or count == 0 or count > limit * 8 // np.dtype(dtype).itemsize:
                        assert not replayed(comm, key), key
                        continue
                    run = setup_of(comm, key[:5])
                    expected = (run.replayable is True or (run.replayable and in_place)) and \
                        not (op == "avg" and dtype == "float16")
                    assert replayed(comm, key) == expected, (key, run.name)
    for count in (1, n + 1, 13):  # mpidp.Comm's: its own records (mpi4py's checks)
        for in_place in (True, False):
            allreduces(comm, "sum", "int64", count, "ring", in_place, wrapped=True)
            key = ("allreduce", count, np.dtype("int64"), "sum", "ring",
                   None if in_place else np.dtype("int64"), "mpi4py")
            assert replayed(comm, key) == (n > 1), key


def check_allgather_and_bcast(comm) -> None:
    n, rank = comm.Get_size(), comm.Get_rank()
    for count in (0, 1, 3, 1000, 70_000):  # items a rank; 70_000 int32: 280 KB a block
        for algorithm in ALLGATHER:
            for in_place, wrapped in ((True, False), (False, False), (True, True),
                                      (False, True)):
                y = np.empty(count * n, np.int32)
                for seed in range(CALLS):
                    x = make_input("sum", "int32", count, rank, seed)
                    started = state.state(comm).started
                    y[...] = -7
                    if in_place:
                        y[rank * count:(rank + 1) * count] = x
                    send = MPI.IN_PLACE if in_place else x
                    if wrapped:
                        mpidp.Comm(comm, algorithm).Allgather(send, y)
                    else:
                        mpidp.allgather(comm, send, y, algorithm=algorithm)
                    what = f"allgather n={n} count={count} {algorithm} in_place={in_place}"
                    one_slot_each(comm, seed, started, what)
                    assert_same(y, native_allgather(comm, x, [count] * n), f"{what} {seed}")
                key = ("allgather", count * n, np.dtype("int32"), algorithm,
                       None if in_place else (count, np.dtype("int32")),
                       "mpi4py" if wrapped else "api")
                if n > 1 and count:
                    run = setup_of(comm, ("allgather", None if in_place else count, count * n,
                                          None, None, np.dtype("int32"), algorithm))
                    assert replayed(comm, key) == (in_place or run.takes_src), (key, run.name)
                else:
                    assert not replayed(comm, key), key
        for algorithm in BCAST:
            for root in {0, n - 1, n // 2}:
                for wrapped in (False, True):
                    buf = np.empty(count, np.float64)
                    for seed in range(CALLS):
                        want = make_input("sum", "float64", count, 0, seed)
                        buf[...] = want if rank == root else -7
                        if wrapped:
                            mpidp.Comm(comm, algorithm).Bcast(buf, root)
                        else:
                            mpidp.bcast(comm, buf, root, algorithm=algorithm)
                        assert_same(buf, want, f"bcast n={n} count={count} {algorithm} "
                                               f"root={root} call {seed}")
                    key = ("bcast", count, np.dtype("float64"), root, algorithm,
                           "mpi4py" if wrapped else "api")
                    assert replayed(comm, key) == (n > 1 and count > 0), key


def check_replay_is_the_planned_bits(comm) -> None:
    """Random floats (the order of the sums shows): a replay equals the planned path, which
    an explicit tag takes, bit for bit."""
    rng = np.random.default_rng(comm.Get_rank())
    for count in (1, 3, 100, 1000):
        for algorithm in ALLREDUCE:
            for _ in range(CALLS):
                x = rng.standard_normal(count).astype(np.float32)
                got, want = np.empty_like(x), np.empty_like(x)
                mpidp.allreduce(comm, x, got, algorithm=algorithm)
                mpidp.allreduce(comm, x, want, algorithm=algorithm, tag=5)
                assert got.tobytes() == want.tobytes(), (comm.Get_size(), count, algorithm)


def check_some_ranks_plan(comm) -> None:
    """Odd ranks never replay (nothing recorded for them): the even ones' replays meet them."""
    record = blocking.record
    if comm.Get_rank() % 2:
        blocking.record = lambda *args, **kw: None
    try:
        n = comm.Get_size()
        for count in (1, n + 1, 13):
            for algorithm in ALLREDUCE:
                for in_place in (True, False):
                    allreduces(comm, "sum", "int64", count, algorithm, in_place)
            for algorithm in ALLGATHER:
                x, y = np.full(count, comm.Get_rank(), np.int64), np.empty(count * n, np.int64)
                for _ in range(CALLS):
                    mpidp.allgather(comm, x, y, algorithm=algorithm)
                    assert np.array_equal(y, np.repeat(np.arange(n), count)), (count, algorithm)
    finally:
        blocking.record = record


@pytest.mark.mpi(ranks=[8], timeout=300)
def test_replayed_calls_match_mpi_on_1_to_8_ranks(mpi_ranks, no_debug_check):
    on_each_size(range(1, 9), check_allreduce)
    on_each_size(range(1, 9), check_allgather_and_bcast)
    on_each_size((2, 3, 5, 8), check_replay_is_the_planned_bits)
    on_each_size((2, 3, 4, 5), check_some_ranks_plan)


@pytest.mark.mpi(ranks=[3], timeout=60)
def test_a_replayed_call_checks_its_arrays_and_keeps_the_sequence(mpi_ranks, no_debug_check):
    comm = MPI.COMM_WORLD
    st = state.state(comm)
    x, y = np.ones(5, np.float64), np.empty(5, np.float64)
    ring = {"algorithm": "ring"}
    for _ in range(CALLS):
        mpidp.allreduce(comm, x, y, **ring)
    assert replayed(comm, ("allreduce", 5, x.dtype, "sum", "ring", x.dtype, "api"))
    readonly = np.empty(5)
    readonly.flags.writeable = False
    bad = [(y, y, "overlap"), (x, readonly, "read-only"),
           (np.ones(10)[::2], y, "C-contiguous")]
    for send, recv, says in bad:
        started = st.started
        with pytest.raises(ValueError, match=says):
            mpidp.allreduce(comm, send, recv, **ring)
        assert st.started == started + 1  # used up, as on the planned path
        assert not st._busy  # and given back
    mpidp.allreduce(comm, x, y, **ring)  # the ranks are still in step
    assert np.array_equal(y, np.full(5, 3.0))


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_a_replayed_call_is_in_the_flight_record_and_fails_as_a_planned_one(mpi_ranks,
                                                                            no_debug_check):
    comm = MPI.COMM_WORLD
    st = state.state(comm)
    x, y = np.full(3, 3e38, np.float32), np.empty(3, np.float32)
    with np.errstate(over="ignore"):
        for _ in range(CALLS):
            mpidp.allreduce(comm, x, y)
    entry = st.flight.calls[-1]
    assert replayed(comm, ("allreduce", 3, x.dtype, "sum", "auto", x.dtype, "api"))
    described = flight._entry(entry)
    assert described["state"] == "complete" and described["collective"] == "allreduce"
    assert described["count"] == 3 and described["seq"] == st.started - 1
    assert described["tag"] == st.tag((st.started - 1) % st.slots, entry[flight.SIGNED].sig)
    assert described["file"] == __file__
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        mpidp.allreduce(comm, x, y)  # the sum overflows: its own work raises
    described = flight._entry(st.flight.calls[-1])
    assert described["state"] == "failed" and "FloatingPointError" in described["error"]
    assert not st._busy  # its slot is back
    x[...] = 1
    mpidp.allreduce(comm, x, y)
    assert np.array_equal(y, np.full(3, 2.0, np.float32))


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_schedules_are_forgotten_with_the_cost_model_and_not_taken_under_debug(
        mpi_ranks, no_debug_check):
    comm = MPI.COMM_WORLD
    st = state.state(comm)
    x, y = np.ones(4, np.int32), np.empty(4, np.int32)
    for _ in range(CALLS):
        mpidp.allreduce(comm, x, y)
    assert st.schedules
    set_model(comm, 1e-6, 1e-9, 1e-10)  # auto may now pick another algorithm
    assert not st.schedules
    for _ in range(CALLS):
        mpidp.allreduce(comm, x, y)
    assert st.schedules
    checks.set_debug(True)
    try:
        assert not blocking.allreduce(comm, x, y, MPI.SUM, "auto")  # the agreement check
        mpidp.allreduce(comm, x, y)
    finally:
        checks.set_debug(False)  # (as `no_debug_check` left it)
    assert np.array_equal(y, np.full(4, 2, np.int32))


@pytest.mark.mpi(ranks=[4], timeout=60)
def test_a_comm_like_is_planned_with_its_own_placement(mpi_ranks, no_debug_check):
    """A comm-like object (its own placement, messages it counts) never replays, not even a
    record made on the communicator it wraps: rabenseifner on two hosts sends other
    messages than on one."""
    comm = MPI.COMM_WORLD
    x, y = np.arange(64, dtype=np.float64), np.empty(64, np.float64)
    for _ in range(CALLS):
        mpidp.allreduce(comm, x, y, algorithm="rabenseifner")
    assert replayed(comm, ("allreduce", 64, x.dtype, "sum", "rabenseifner", x.dtype, "api"))
    two_hosts = mpidp.CountingComm(comm, placement=(0, 0, 1, 1))
    for _ in range(CALLS):
        assert not blocking.allreduce(two_hosts, x, y, MPI.SUM, "rabenseifner")
        two_hosts.reset()
        mpidp.allreduce(two_hosts, x, y, algorithm="rabenseifner")
        assert two_hosts.messages_sent > 0  # planned, through it
        assert np.array_equal(y, 4 * x)


def strided_allreduce(comm, buf, blocks, op, tmp, src=None):
    """A toy all-reduce of 2 ranks that reduces through strided views (even items, then
    odd ones): no run of a buffer's items, so it cannot be noted as a part of one."""
    rank = comm.Get_rank()
    partner, src = 1 - rank, buf if src is None else src
    yield [Send(src, partner), Recv(tmp, partner)]
    for half in (slice(0, None, 2), slice(1, None, 2)):
        mine, theirs = src[half], tmp[half]
        op(buf[half], *((theirs, mine) if rank < partner else (mine, theirs)))


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_a_schedule_with_strided_views_is_planned(mpi_ranks, no_debug_check):
    comm = MPI.COMM_WORLD
    register(Algorithm("allreduce", "toy_strided", strided_allreduce,
                       REGISTRY["allreduce"]["recursive_doubling"].cost, one_vector))
    try:
        x, y = np.arange(6, dtype=np.float64) + comm.Get_rank(), np.empty(6)
        for _ in range(CALLS):
            mpidp.allreduce(comm, x, y, algorithm="toy_strided")
            assert np.array_equal(y, 2 * np.arange(6) + 1)
        key = ("allreduce", 6, x.dtype, "sum", "toy_strided", x.dtype, "api")
        assert state.state(comm).schedules.get(key) == schedules.PLANNED
    finally:
        unregister("allreduce", "toy_strided")
