"""Small blocking all-reduces replayed from a recorded schedule (mpidp/collectives/small.py).

What the replay must keep: the MPI library's results on the same inputs (every rank count
1 to 8, counts 0, 1, below N, not divisible by N, up to and past the size limit), the
planned path's bits, the sequence (one slot a call), the checks of bad arrays, the flight
record, and the wire: a rank that replays and a rank that plans exchange the same messages.
"""

import numpy as np
import pytest
from helpers.oracle import OPS as MPI_OPS
from helpers.oracle import assert_same, counts_for, make_input, native_allreduce
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp import flight
from mpidp.collectives import checks, small, state
from mpidp.collectives.algorithms import REGISTRY
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.ops import OPS
from mpidp.collectives.algorithms.rounds import Send
from mpidp.collectives.cost import set_model

CALLS = 3  # the first records, the others replay
ALGORITHMS = ("auto", "ring", "rabenseifner", "recursive_doubling")


class Ranks:
    """A comm as the algorithms see it: a rank and a size (they make no other call)."""

    def __init__(self, rank: int, n: int):
        self.rank, self.n = rank, n

    def Get_rank(self):  # noqa: N802
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.n


def messages(algo, rank: int, n: int, count: int, in_place: bool) -> list:
    """Rank `rank`'s rounds, run dry, as (send?, peer, bytes) per message."""
    buf, src = np.zeros(count, np.float32), np.zeros(count, np.float32)
    blocks = Blocks.even(count, n)
    tmp = np.zeros(algo.scratch(blocks), np.float32)
    rounds = algo.rounds(Ranks(rank, n), buf, blocks, OPS["sum"], tmp, None if in_place else src)
    return [[(type(m) is Send, m.peer, m.buf.nbytes) for m in round_] for round_ in rounds]


@pytest.mark.parametrize("name", sorted(n for n, a in REGISTRY["allreduce"].items()
                                        if a.replayable and not a.placed))
def test_in_place_and_out_of_place_send_the_same_messages(name):
    """Why a rank may replay in place what another plans out of place: the wire is the same."""
    algo = REGISTRY["allreduce"][name]
    for n in range(1, 9):
        for count in counts_for(n) + [1000]:
            for rank in range(n):
                assert messages(algo, rank, n, count, True) == \
                    messages(algo, rank, n, count, False), (name, n, count, rank)


def calls(comm, op: str, dtype: str, count: int, algorithm: str, in_place: bool,
          wrapped: bool = False) -> None:
    """`CALLS` all-reduces with new inputs, through `mpidp.allreduce` or `mpidp.Comm`."""
    rank = comm.Get_rank()
    y = np.empty(count, dtype)
    allreduce = mpidp.Comm(comm, algorithm).Allreduce if wrapped else \
        lambda send, recv, op: mpidp.allreduce(comm, send, recv, op=op, algorithm=algorithm)
    for seed in range(CALLS):
        x = make_input(op, dtype, count, rank, seed)
        started = state.state(comm).started
        if in_place:
            y[...] = x
            allreduce(MPI.IN_PLACE, y, op=MPI_OPS[op] if wrapped else op)
        else:
            y[...] = -7
            allreduce(x, y, op=MPI_OPS[op] if wrapped else op)
        what = (f"{op} {dtype} n={comm.Get_size()} count={count} {algorithm} "
                f"in_place={in_place} wrapped={wrapped}")
        if seed:  # one slot a call (the first may calibrate auto's cost model: more)
            assert state.state(comm).started == started + 1, what
        assert_same(y, native_allreduce(comm, x, op), f"{what} call {seed}")


def replayed(comm, count: int, dtype: str, op: str, algorithm: str, in_place: bool,
             checks: str = "api") -> bool:
    key = (count, np.dtype(dtype), op, algorithm, None if in_place else np.dtype(dtype), checks)
    return isinstance(state.state(comm).schedules.get(key), small.Schedule)


def replayable(comm, count: int, dtype: str, op: str, algorithm: str) -> bool:
    """Small enough, more than one rank, and the algorithm run (auto's pick) replayable."""
    if not 0 < count * np.dtype(dtype).itemsize <= small.SMALL_BYTES or comm.Get_size() == 1:
        return False
    run = state.state(comm).setups[("allreduce", count, np.dtype(dtype), op, algorithm)].algo
    return bool(run.replayable) and not run.placed


def check_match_mpi(comm) -> None:
    n = comm.Get_size()
    cases = [("sum", "int64"), ("max", "int32"), ("prod", "float64"), ("avg", "float32"),
             ("sum", "float32")]
    for op, dtype in cases:
        for count in counts_for(n) + [1024, 1025]:  # float32: 4 KiB, and one item past it
            for algorithm in ALGORITHMS:
                for in_place in (True, False):
                    calls(comm, op, dtype, count, algorithm, in_place)
                    assert replayed(comm, count, dtype, op, algorithm, in_place) == \
                        replayable(comm, count, dtype, op, algorithm), \
                        (op, dtype, n, count, algorithm, in_place)
    for count in (1, n + 1, 13):  # mpidp.Comm's: its own schedules (mpi4py's checks)
        for in_place in (True, False):
            calls(comm, "sum", "int64", count, "auto", in_place, wrapped=True)
            assert replayed(comm, count, "int64", "sum", "auto", in_place, "mpi4py") == \
                replayable(comm, count, "int64", "sum", "auto")


def check_replay_is_the_planned_bits(comm) -> None:
    """Random floats (the order of the sums shows): the replay equals the planned path, which
    an explicit tag takes, bit for bit."""
    rng = np.random.default_rng(comm.Get_rank())
    for count in (1, 3, 100, 1000):
        for algorithm in ALGORITHMS:
            for _ in range(CALLS):
                x = rng.standard_normal(count).astype(np.float32)
                got, want = np.empty_like(x), np.empty_like(x)
                mpidp.allreduce(comm, x, got, algorithm=algorithm)
                mpidp.allreduce(comm, x, want, algorithm=algorithm, tag=5)
                assert got.tobytes() == want.tobytes(), (comm.Get_size(), count, algorithm)


def check_some_ranks_plan(comm) -> None:
    """Odd ranks never replay (their limit 0): the even ones' replays still meet them."""
    limit = small.SMALL_BYTES
    small.SMALL_BYTES = 0 if comm.Get_rank() % 2 else limit
    try:
        for count in (1, comm.Get_size() + 1, 13):
            for algorithm in ALGORITHMS:
                calls(comm, "sum", "int64", count, algorithm, in_place=False)
                calls(comm, "sum", "int64", count, algorithm, in_place=True)
    finally:
        small.SMALL_BYTES = limit


@pytest.mark.mpi(ranks=[8], timeout=240)
def test_replayed_small_calls_match_mpi_on_1_to_8_ranks(mpi_ranks, no_debug_check):
    on_each_size(range(1, 9), check_match_mpi)
    on_each_size((2, 3, 5, 8), check_replay_is_the_planned_bits)
    on_each_size((2, 3, 4, 5), check_some_ranks_plan)


@pytest.mark.mpi(ranks=[3], timeout=60)
def test_a_replayed_call_checks_its_arrays_and_keeps_the_sequence(mpi_ranks, no_debug_check):
    comm = MPI.COMM_WORLD
    st = state.state(comm)
    x, y = np.ones(5, np.float64), np.empty(5, np.float64)
    ring = {"algorithm": "ring"}  # (auto picks direct on 3 ranks, which is not replayed)
    for _ in range(CALLS):
        mpidp.allreduce(comm, x, y, **ring)
    assert isinstance(st.schedules.get((5, x.dtype, "sum", "ring", x.dtype, "api")),
                      small.Schedule)
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
    assert isinstance(st.schedules.get((3, x.dtype, "sum", "auto", x.dtype, "api")), small.Schedule)
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
        assert not small.allreduce(comm, x, y, MPI.SUM, "auto")  # the agreement check plans
        mpidp.allreduce(comm, x, y)
    finally:
        checks.set_debug(False)  # (as `no_debug_check` left it)
    assert np.array_equal(y, np.full(4, 2, np.int32))
