"""Many collectives in flight on one communicator, and ranks that disagree: never a wrong answer.

MPI matches collectives by the order of the calls; mpidp matches them by the tag
sequence of the communicator (`mpidp.collectives.state`). These tests start up to
16 collectives of every kind and algorithm at once, through the functions and
through two `mpidp.Comm` wrappers of the same communicator, complete them in an
order that differs per rank, and compare every result with the MPI library's.
"""

import threading
import time

import numpy as np
import pytest
from helpers.comms import NarrowTags
from helpers.oracle import (
    assert_same,
    counts_for,
    make_input,
    native_allgather,
    native_allreduce,
    native_reduce_scatter,
)
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from hypothesis import given, settings
from hypothesis import strategies as st_
from mpi4py import MPI

import mpidp
from mpidp.collectives import checks, state
from mpidp.collectives.algorithms.blocks import Blocks

KINDS = [("allreduce", a) for a in mpidp.ALGORITHMS["allreduce"]] + \
        [("reduce_scatter", a) for a in mpidp.ALGORITHMS["reduce_scatter"]] + \
        [("allgather", a) for a in mpidp.ALGORITHMS["allgather"]] + \
        [("bcast", a) for a in mpidp.ALGORITHMS["bcast"]]


def start(comm, wrappers, i: int, kind: str, algorithm: str, count: int, dtype: str, op: str):
    """Start collective i; return (request, result getter, expected result)."""
    n, rank = comm.Get_size(), comm.Get_rank()
    via = wrappers[i % 3]  # 0: the functions; 1, 2: two mpidp.Comm wrappers of `comm`
    x = make_input(op, dtype, count, rank, seed=i)
    if kind == "allreduce":
        want = native_allreduce(comm, x, op)
        y = np.full_like(x, 7)
        if via is None:
            req = mpidp.iallreduce(comm, x, y, op=op, algorithm=algorithm)
        else:
            req = via.Iallreduce(x, y, op=mpidp.OPS[op], algorithm=algorithm)
        return req, (lambda: y), want
    if kind == "reduce_scatter":
        blocks = Blocks.even(count, n)
        want = native_reduce_scatter(comm, x, blocks.counts, op)
        y = np.full(blocks.counts[rank], 7, dtype=x.dtype)
        if via is None:
            req = mpidp.ireduce_scatter(comm, x, y, list(blocks.counts), op=op, algorithm=algorithm)
        else:
            req = via.Ireduce_scatter(x, y, list(blocks.counts), op=mpidp.OPS[op],
                                      algorithm=algorithm)
        return req, (lambda: y), want
    if kind == "allgather":
        blocks = Blocks.even(count, n)
        mine = make_input("sum", dtype, blocks.counts[rank], rank, seed=i)
        want = native_allgather(comm, mine, blocks.counts)
        y = np.full(count, 7, dtype=mine.dtype)
        if via is None:
            req = mpidp.iallgather(comm, mine, y, list(blocks.counts), algorithm=algorithm)
        else:
            req = via.Iallgatherv(mine, [y, list(blocks.counts)], algorithm=algorithm)
        return req, (lambda: y), want
    root = i % n
    want = make_input("sum", dtype, count, root, seed=i)
    y = want.copy() if rank == root else np.full_like(want, 7)
    req = (mpidp.ibcast(comm, y, root, algorithm=algorithm) if via is None
           else via.Ibcast(y, root, algorithm=algorithm))
    return req, (lambda: y), want


def in_flight(comm, trials: int, seed: int) -> None:
    n, rank = comm.Get_size(), comm.Get_rank()
    wrappers = [None, mpidp.Comm(comm), mpidp.Comm(comm)]
    plan = np.random.default_rng(seed)  # the same on every rank: the order of the calls
    mine = np.random.default_rng([seed, rank])  # differs per rank: the order of completion
    for trial in range(trials):
        started = []
        for i in range(int(plan.integers(2, 17))):
            kind, algorithm = KINDS[plan.integers(len(KINDS))]
            count = int(plan.choice(counts_for(n) + [1000]))
            dtype = str(plan.choice(["int32", "float64", "uint8"]))
            op = str(plan.choice(["sum", "max", "prod", "bor"] if dtype != "float64"
                                 else ["sum", "max", "min", "avg"]))
            started.append((i, kind, algorithm, count, dtype, op,
                            *start(comm, wrappers, i, kind, algorithm, count, dtype, op)))
        if trial % 2 == 0:  # test() in a random order of this rank's own
            pending = list(started)
            while pending:
                pick = pending[int(mine.integers(len(pending)))]
                if pick[6].test():
                    pending.remove(pick)
        else:  # wait() in reverse order
            for entry in reversed(started):
                entry[6].wait()
        for i, kind, algorithm, count, dtype, op, _, result, want in started:
            assert_same(result(), want, f"trial {trial}, #{i} {kind}/{algorithm} "
                                        f"count={count} {dtype} {op}")


@pytest.mark.mpi(ranks=[8], timeout=480)
def test_many_collectives_in_flight_complete_in_any_order(mpi_ranks):
    """N = 1..8 in one launch: a communicator of each size (tests/helpers/subcomms.py)."""
    def check(comm):
        in_flight(comm, trials=4, seed=comm.Get_size())
        # the state is the communicator's: every wrapper and function took numbers from it
        assert state.state(mpidp.Comm(comm)) is state.state(comm)
        assert not state.state(comm)._busy  # every slot given back

    on_each_size(range(1, 9), check)


def patched(check):
    """``check(comm, monkeypatch)`` with a monkeypatch of its own, undone after each size
    (as pytest's fixture was after each launch)."""
    def run(comm):
        with pytest.MonkeyPatch.context() as monkeypatch:
            check(comm, monkeypatch)
    return run


def check_a_call_that_raises_uses_its_number_up_on_every_rank(world):
    comm = world.Dup()
    st = state.state(comm)
    before = st.started
    x, y = np.arange(6.0), np.empty(6)
    with pytest.raises(ValueError, match="unknown allreduce algorithm"):
        mpidp.iallreduce(comm, x, y, algorithm="butterfly")  # raises on every rank
    with pytest.raises(ValueError, match="unknown op"):
        mpidp.Comm(comm).Iallreduce(x, y, op="mean")
    assert st.started == before + 2 and not st._busy
    in_flight(comm, trials=2, seed=11)  # the ranks still agree on the sequence
    comm.Free()


def check_wrapping_around_the_tag_range_is_a_clear_error(world, monkeypatch):
    monkeypatch.setattr(state, "SLOTS", 4)
    comm = world.Dup()
    n = comm.Get_size()
    xs = [np.arange(10 * n, dtype=np.float64) + k for k in range(5)]
    ys = [np.empty_like(x) for x in xs]
    reqs = [mpidp.iallreduce(comm, xs[k], ys[k], algorithm="ring") for k in range(4)]
    with pytest.raises(RuntimeError, match="4 collectives are in flight"):
        mpidp.iallreduce(comm, xs[4], ys[4], algorithm="ring")  # slot 0 is still busy
    mpidp.waitall(reqs)
    mpidp.allreduce(comm, xs[4], ys[4], algorithm="ring")  # free again
    for x, y in zip(xs, ys, strict=True):
        assert np.array_equal(y, n * x)  # the same x on every rank
    comm.Free()


def check_an_explicit_tag_must_be_the_users(world):
    comm = mpidp.CountingComm(world)
    x, y = np.ones(4), np.empty(4)
    for bad in (mpidp.TAG_BASE, mpidp.TAG_BASE + 5, -1, 1.5):
        with pytest.raises(ValueError, match="explicit tag"):
            mpidp.allreduce(comm, x, y, tag=bad)
    assert comm.messages_sent == 0 and comm.bytes_received == 0
    started = state.state(comm).started
    mpidp.allreduce(comm, x, y, tag=42, algorithm="ring")  # the user's own tag: no number
    assert np.array_equal(y, np.full(4, 2.0)) and state.state(comm).started == started


def check_the_standards_smallest_tag_bound_runs_persistent_collectives(world):
    """A communicator whose tag bound is 32767 (the least MPI allows) runs persistent
    collectives beside plain ones, every tag within the bound."""
    comm = NarrowTags(world.Dup())
    n = comm.Get_size()
    st = state.state(comm)
    assert st.half < st.sigs  # room for persistent collectives
    x, y, w = np.arange(4.0 * n), np.empty(4 * n), np.empty(4)
    reqs = [mpidp.allreduce_init(comm, x, y, algorithm=a) for a in ("ring", "auto")]
    reqs.append(mpidp.Comm(comm).Reduce_scatter_block_init(x, w, algorithm="ring"))
    z = np.empty_like(x)
    for _ in range(3):
        mpidp.Persistent.Startall(reqs)
        plain = mpidp.iallreduce(comm, x, z, algorithm="ring")  # in flight alongside
        mpidp.waitall([plain, *reqs])
        assert np.array_equal(y, n * x) and np.array_equal(z, n * x)
        assert np.array_equal(w, n * x[4 * comm.Get_rank():][:4])
    for req in reqs:
        req.Free()
    assert comm.tags and min(comm.tags) >= state.TAG_BASE and max(comm.tags) <= 32767
    comm._comm.Free()


# One launch for the sequence's checks (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[3], timeout=120)
def test_a_raising_call_takes_its_number_wrapping_around_is_an_error_and_tags_are_users(
        mpi_ranks):
    """A call that raises uses its number up on every rank (N = 3); wrapping around the tag
    range is a clear error (N = 2, 3); an explicit tag must be the user's (N = 2); the
    smallest tag bound MPI allows runs persistent collectives (N = 2, 3)."""
    on_each_size((3,), check_a_call_that_raises_uses_its_number_up_on_every_rank)
    on_each_size((2, 3), patched(check_wrapping_around_the_tag_range_is_a_clear_error))
    on_each_size((2,), check_an_explicit_tag_must_be_the_users)
    on_each_size((2, 3), check_the_standards_smallest_tag_bound_runs_persistent_collectives)


def test_the_sequence_is_thread_safe():
    st = state.CommState(tag_ub=1 << 29)
    taken = []

    def worker():
        for _ in range(500):
            slot = st.take()
            taken.append(slot)
            st.release(slot)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert st.started == 4000 and not st._busy
    assert sorted(taken) == sorted(k % state.SLOTS for k in range(4000))


def test_tags_fold_the_signature_and_stay_in_range():
    wide = state.CommState(tag_ub=(1 << 29) - 1)
    assert wide.sigs == 1 << 16 and wide.slots == state.SLOTS
    narrow = state.CommState(tag_ub=32767)  # the standard's least: fewer slots, not signatures
    assert narrow.sigs >= state.MIN_SIGS and narrow.half < narrow.sigs
    for st in (wide, narrow):
        tags = {st.tag(slot, sig) for slot in (0, 1, st.slots - 1) for sig in (0, 1, 2, 77)}
        assert min(tags) >= state.TAG_BASE and max(tags) <= st.sigs * st.slots + state.TAG_BASE
    assert wide.tag(3, 0) == state.TAG_BASE + 3  # no signature: the plain slot
    assert wide.tag(3, 1) != wide.tag(3, 2)  # different calls, different tags
    a = state.signature("allreduce", 10, np.dtype("f4"), mpidp.SUM, "ring")
    assert a == state.signature("allreduce", 10, np.dtype("f4"), mpidp.SUM, "ring")
    for other in [("allreduce", 10, np.dtype("i4"), mpidp.SUM, "ring"),
                  ("allreduce", 11, np.dtype("f4"), mpidp.SUM, "ring"),
                  ("allreduce", 10, np.dtype("f4"), mpidp.MAX, "ring"),
                  ("allreduce", 10, np.dtype("f4"), mpidp.SUM, "rabenseifner")]:
        assert state.signature(*other) != a, other


@settings(max_examples=300, deadline=None)
@given(tag_ub=st_.integers(32767, 2**31 - 1), slot=st_.integers(0, 1 << 20),
       sig=st_.integers(0, 2**32 - 1), other=st_.integers(1, 2**32 - 1))
def test_every_tag_is_within_the_bound_and_persistent_ones_have_their_own(tag_ub, slot, sig,
                                                                          other):
    """Any tag bound MPI may give: every tag lies in TAG_BASE..bound, a slot's tag is its
    own (no other slot's), and persistent tags never meet those of collectives started once."""
    st = state.CommState(tag_ub=tag_ub)
    slot %= st.slots
    assert st.sigs >= state.MIN_SIGS and st.half < st.sigs
    plain, held = st.tag(slot, sig), st.tag(slot, sig, persistent=True)
    for tag in (plain, held):
        assert state.TAG_BASE <= tag <= tag_ub and (tag - state.TAG_BASE) % st.slots == slot
    assert held != plain and held not in {st.tag(slot, s) for s in (0, other, sig ^ other)}


def test_every_communicator_of_the_job_has_the_worlds_tag_bound():
    """COMM_SELF, its duplicates, Split and Create ones: the world's tag bound, so the same
    tag scheme (Open MPI gives the attribute on COMM_WORLD and its duplicates only)."""
    world_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    made = [MPI.COMM_SELF.Dup(), MPI.COMM_WORLD.Split(0), MPI.COMM_WORLD.Dup(),
            MPI.COMM_WORLD.Create(MPI.COMM_WORLD.Get_group())]
    for comm in (MPI.COMM_SELF, *made):
        st = state.state(comm)
        assert (st.sigs, st.half) == (state.CommState(world_ub).sigs,
                                      state.CommState(world_ub).half), comm
    x, y = np.arange(3.0), np.empty(3)
    for comm in made[:2]:  # persistent collectives need the wide range
        req = mpidp.allreduce_init(comm, x, y)
        req.Start()
        req.Wait()
        assert np.array_equal(y, comm.Get_size() * x)
        req.Free()
    for comm in made:
        comm.Free()


# ---------------------------------------------------------------- ranks that disagree

def mismatches(rank: int):
    """(what, start) pairs: each rank's call differs from its neighbours' in one thing."""
    odd = rank % 2
    x8 = np.ones(8, "f4" if odd else "i4")  # equal byte sizes: MPI would add garbage
    return [
        ("dtype", lambda c: mpidp.iallreduce(c, x8, np.full_like(x8, 7), algorithm="ring")),
        ("op", lambda c: mpidp.iallreduce(c, np.ones(8), np.full(8, 7.0),
                                          op="max" if odd else "sum", algorithm="ring")),
        ("count", lambda c: mpidp.iallreduce(c, np.ones(8 + odd), np.full(8 + odd, 7.0),
                                             algorithm="ring")),
        ("algorithm", lambda c: mpidp.iallreduce(
            c, np.ones(8), np.full(8, 7.0), algorithm="ring" if odd else "recursive_doubling")),
    ]


def check_disagreeing_ranks_never_exchange_data(world):
    """Without the debug check: a rank never takes data from a rank whose call differs.

    Each case runs on a communicator of its own, kept until the end, so that the
    messages left over from one stalled case cannot meet the next one's.
    """
    rank = world.Get_rank()
    comms = []
    for what, call in mismatches(rank):
        comms.append(world.Dup())
        req = call(comms[-1])
        try:
            req.wait(timeout=0.5)  # a deadline: the job's watchdog in a real run
        except TimeoutError:
            stalled = True
        else:
            stalled = False
        flags = world.allgather(stalled)
        assert all(flags), f"{what}: some rank completed with a mismatched peer: {flags}"
        for r in req._reqs:  # take this rank's posted receives back
            r.Cancel()
            r.Wait()
    # a root that differs: every rank that completes holds the buffer of the root it named
    comms.append(world.Dup())
    root = rank % 2
    y = np.full(8, float(rank + 1)) if rank == root else np.full(8, -1.0)
    req = mpidp.ibcast(comms[-1], y, root=root, algorithm="binomial")
    try:
        req.wait(timeout=0.5)
    except TimeoutError:
        assert np.array_equal(y, np.full(8, -1.0)), "a stalled rank was written to"
    else:
        assert np.array_equal(y, np.full(8, float(root + 1))), (rank, y)
    for r in req._reqs:
        r.Cancel()
        r.Wait()
    world.Barrier()
    for comm in comms:
        comm.Free()


def persistent_mismatches(rank: int):
    """(what, create) pairs for persistent collectives (``*_init``): each rank's call differs
    from its neighbours' in one thing. Their tags lie in a range of their own, kept for life:
    the signature must be folded in there too."""
    odd = rank % 2
    x8 = np.ones(8, "f4" if odd else "i4")  # equal byte sizes: MPI would add garbage
    n8 = 8 + odd
    return [
        ("dtype", lambda c: mpidp.allreduce_init(c, x8, np.full_like(x8, 7), algorithm="ring")),
        ("op", lambda c: mpidp.allreduce_init(c, np.ones(8), np.full(8, 7.0),
                                              op="max" if odd else "sum", algorithm="ring")),
        ("count", lambda c: mpidp.allreduce_init(c, np.ones(n8), np.full(n8, 7.0),
                                                 algorithm="ring")),
        ("algorithm", lambda c: mpidp.allreduce_init(
            c, np.ones(8), np.full(8, 7.0), algorithm="ring" if odd else "recursive_doubling")),
        ("reduce_scatter op", lambda c: mpidp.Comm(c).Reduce_scatter_block_init(
            np.ones(2 * c.Get_size()), np.full(2, 7.0), op=MPI.MAX if odd else MPI.SUM,
            algorithm="ring")),
        ("allgather dtype", lambda c: mpidp.allgather_init(
            c, x8[:2], np.full(2 * c.Get_size(), 7, x8.dtype), algorithm="ring")),
    ]


def check_disagreeing_persistent_collectives_never_exchange_data(world):
    """As above, for ``*_init``: started, the mismatched calls stall on every rank (were the
    signature left out of persistent tags, they would match and exchange data)."""
    comms, matched = [], {}
    for what, create in persistent_mismatches(world.Get_rank()):
        comms.append(world.Dup())
        req = create(comms[-1])
        req.Start()
        try:
            req.wait(timeout=0.5)
        except TimeoutError:
            stalled = True
        except MPI.Exception:  # a message of another size was matched (truncated): data met
            stalled = False
        else:
            stalled = False
        flags = world.allgather(stalled)
        if not all(flags):
            matched[what] = flags
        for r in req.request._reqs:  # take this rank's posted receives back
            if r:  # (where messages met, some are complete: null)
                r.Cancel()
            r.Wait()
    world.Barrier()
    for comm in comms:
        comm.Free()
    assert not matched, f"ranks completed with a mismatched peer (stalled per rank): {matched}"


def check_debug_check_names_every_ranks_value_whatever_the_length(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    assert checks.debug_enabled(), "the suite runs with MPIDP_DEBUG=1 (tests/conftest.py)"
    long_counts = tuple(range(10_000, 10_000 + 100))  # a description far over 256 bytes
    dtype = "float32" if rank == n - 1 else "float64"  # and the difference at its end
    with pytest.raises(ValueError, match="ranks disagree") as info:
        checks.agree(comm, "test", 1, counts=long_counts, dtype=dtype)
    message = str(info.value)
    assert comm.allgather(message) == [message] * n  # the same error on every rank
    for r in range(n):
        assert f"rank {r}: counts=" in message
    assert message.count("dtype=float32") == 1 and message.count("dtype=float64") == n - 1
    checks.agree(comm, "test", 2, counts=long_counts, dtype="float64")  # agreement: no error
    # the environment's check applies whatever the call says (debug=False here)
    x = np.ones(10 + (rank == n - 1))
    with pytest.raises(ValueError, match="ranks disagree"):
        mpidp.allreduce(comm, x, np.empty_like(x), debug=False)
    with pytest.raises(ValueError, match="ranks disagree"):
        mpidp.Comm(comm).Bcast(np.ones(4), root=rank % 2)
    y = np.empty(10)
    mpidp.allreduce(comm, np.ones(10), y)
    assert np.array_equal(y, np.full(10, n))


# ------------------------------------------------- the agreement check comes before anything

def _algorithm_cases(algorithm: str, n: int):
    """(what, call) pairs: each collective, through the functions, mpidp.Comm and *_init."""
    x, y = np.ones(2 * n), np.empty(2 * n)

    def persistent(c):
        mpidp.allreduce_init(c, x, y, algorithm=algorithm).Free()

    return [
        ("allreduce", lambda c: mpidp.allreduce(c, x, y, algorithm=algorithm)),
        ("reduce_scatter", lambda c: mpidp.reduce_scatter(c, x, y[:2], algorithm=algorithm)),
        ("allgather", lambda c: mpidp.iallgather(c, x[:2], y, algorithm=algorithm).wait()),
        ("bcast", lambda c: mpidp.bcast(c, y, algorithm="binomial" if algorithm == "ring"
                                        else algorithm)),
        ("mpidp.Comm", lambda c: mpidp.Comm(c, algorithm).Allreduce(x, y)),
        ("allreduce_init", persistent),
    ]


def check_debug_check_compares_the_algorithm_as_passed_before_auto_sets_up(world):
    """``auto`` on rank 0 and ``ring`` on the others: with MPIDP_DEBUG=1 every rank raises.

    auto's set-up is collective (the cost model's calibration, the placement query),
    so a check made after it hung: rank 0 calibrated alone. The check compares what
    was passed, so ``auto`` against ``ring`` differs even where auto would pick the ring.
    """
    n, rank = world.Get_size(), world.Get_rank()
    assert checks.debug_enabled(), "the suite runs with MPIDP_DEBUG=1 (tests/conftest.py)"
    algorithm = "auto" if rank == 0 else "ring"
    for what, call in _algorithm_cases(algorithm, n):
        comm = world.Dup()  # no model, no placement yet: auto would set both up here
        with pytest.raises(ValueError, match="ranks disagree") as info:
            call(comm)
        message = str(info.value)
        assert "rank 0:" in message and "algorithm=auto" in message, (what, message)
        assert message.count("algorithm=auto") == 1, (what, message)
        assert state.state(comm).model is None, f"{what}: auto set up before the check"
        assert world.allgather(message) == [message] * n  # the same error on every rank
        x, y = np.arange(3.0), np.empty(3)
        mpidp.allreduce(comm, x, y, algorithm="ring")  # still in step
        assert np.array_equal(y, n * x)
        comm.Free()


# One launch for the ranks that disagree (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[5], timeout=180)
def test_disagreeing_ranks_never_exchange_data_and_the_debug_check_names_them(mpi_ranks):
    """Without the debug check, disagreeing ranks never exchange data, in plain calls
    (N = 2, 3, 4) and persistent ones (N = 2, 3); with it, the error names every rank's
    value whatever its length (N = 2, 5) and compares the algorithm as passed, before
    ``auto`` sets up (N = 2, 3)."""
    with debug_check_off():
        on_each_size((2, 3, 4), check_disagreeing_ranks_never_exchange_data)
        on_each_size((2, 3), check_disagreeing_persistent_collectives_never_exchange_data)
    on_each_size((2, 5), check_debug_check_names_every_ranks_value_whatever_the_length)
    on_each_size((2, 3), check_debug_check_compares_the_algorithm_as_passed_before_auto_sets_up)


def test_timeout_message_names_what_is_left_to_look_at():
    """The deadline's message suggests MPIDP_DEBUG=1 only where it is off; where it is on,
    the arguments were compared, and it says what else stalls a collective."""
    before = checks.debug_enabled()
    buf = np.empty(1)
    try:
        for debug in (False, True):
            checks.set_debug(debug)
            req = MPI.COMM_SELF.Irecv(buf, 0, 3)  # no message will come
            with pytest.raises(TimeoutError) as info:
                mpidp.waitall([req], timeout=0.05)
            req.Cancel()
            req.Wait()
            message = str(info.value)
            assert ("MPIDP_DEBUG=1 checks" in message) is not debug, message
            if debug:
                assert "two threads" in message and "raised" in message, message
    finally:
        checks.set_debug(before)


# ------------------------------------------------- two threads starting collectives at once

class Mirror:
    """Rank 0 of 2 in one process: every message to or from rank 1 is to or from itself,
    so an all-reduce gives twice the input. Once `hold` is set, its first exchange waits
    for `go`: the collective stays in its start until the test lets it out."""

    def __init__(self, comm):
        self.comm, self.hold, self.go, self.inside = comm, False, threading.Event(), \
            threading.Event()

    def Get_size(self):  # noqa: N802
        return 2

    def Get_rank(self):  # noqa: N802
        return 0

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):  # noqa: N802
        if self.hold:
            self.inside.set()
            assert self.go.wait(10)
        return self.comm.Sendrecv(sendbuf, 0, sendtag, recvbuf, 0, recvtag)

    def Isend(self, buf, dest, tag):  # noqa: N802
        return self.comm.Isend(buf, 0, tag)

    def Irecv(self, buf, source, tag):  # noqa: N802
        return self.comm.Irecv(buf, 0, tag)

    def __getattr__(self, name):
        return getattr(self.comm, name)


def test_two_threads_starting_collectives_at_once_raise_with_debug():
    """MPIDP_DEBUG=1: a thread that starts a collective on a communicator while another
    thread is starting one there raises, naming both; one after the other is fine."""
    before = checks.debug_enabled()
    checks.set_debug(True)
    try:
        comm = Mirror(MPI.COMM_SELF.Dup())
        x, y, errors = np.ones(4), np.empty(4), []
        mpidp.allreduce(comm, x, y, algorithm="ring")  # the mirror works: twice the input
        assert np.array_equal(y, 2 * x)
        comm.hold, y[:] = True, 0

        def second():
            try:
                mpidp.allreduce(comm, x, np.empty(4), algorithm="ring")
            except RuntimeError as e:
                errors.append(e)
            finally:
                comm.go.set()

        first = threading.Thread(target=lambda: mpidp.allreduce(comm, x, y, algorithm="ring"),
                                 name="first-starter")
        first.start()
        assert comm.inside.wait(10)  # first is in its start (its agreement check)
        t = threading.Thread(target=second, name="second-starter")
        t.start()
        t.join(10)
        first.join(10)
        assert len(errors) == 1, errors
        assert "first-starter" in str(errors[0]) and "second-starter" in str(errors[0])
        assert np.array_equal(y, 2 * x)  # the first one completed, undisturbed
        # one thread after the other: not at once, no error (the program orders them)
        for name in ("later-a", "later-b"):
            t = threading.Thread(target=mpidp.allreduce, args=(comm, x, y),
                                 kwargs={"algorithm": "ring"}, name=name)
            t.start()
            t.join(10)
        # a start that starts another on its own thread: Reduce_scatter gathers its counts
        y2 = np.zeros(2)
        mpidp.Comm(comm, "ring").Reduce_scatter(np.ones(4), y2)
        assert np.array_equal(y2, [2.0, 2.0])
        assert not state.state(comm)._busy
        comm.comm.Free()
    finally:
        checks.set_debug(before)


def check_two_threads_at_once_raise_there_and_the_others_end_at_their_deadline(world,
                                                                             monkeypatch):
    """On rank 0 a second thread starts a collective while the main thread's is in flight:
    it raises there, naming both threads; the other ranks, which wait for rank 0's second
    collective, end at MPIDP_TIMEOUT with a message that points at such a rank."""
    from mpidp.collectives.engine import completion

    n, rank = world.Get_size(), world.Get_rank()
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
    assert checks.debug_enabled()
    comm = world.Dup()
    x, y = np.full(4, float(rank + 1)), np.empty(4)
    want = np.full(4, n * (n + 1) / 2)
    if rank == 0:
        errors = []

        def intruder():
            time.sleep(0.3)  # the main thread is in its all-reduce: the others wait for us
            try:
                mpidp.allreduce(comm, x, np.empty(4), algorithm="ring")
            except RuntimeError as e:
                errors.append(e)
            for r in range(1, n):
                world.send("go", dest=r, tag=77)

        t = threading.Thread(target=intruder, name="intruder")
        t.start()
        mpidp.allreduce(comm, x, y, algorithm="ring")
        t.join()
        assert len(errors) == 1, errors
        assert "intruder" in str(errors[0]) and "MainThread" in str(errors[0]), errors[0]
    else:
        assert world.recv(source=0, tag=77) == "go"
        mpidp.allreduce(comm, x, y, algorithm="ring")  # the main thread's all-reduce of rank 0
    assert np.array_equal(y, want)
    world.Barrier()
    if rank != 0:  # the all-reduce the intruder never made, with a deadline
        monkeypatch.setattr(completion, "_default_timeout", 1.0)
        with pytest.raises(TimeoutError, match="two threads"):
            mpidp.allreduce(comm, x, y, algorithm="ring")
    world.Barrier()  # (comm keeps the stalled messages: never used again)


# ------------------------------------------------- a collective that raises while it runs

def check_a_collective_that_raises_while_it_runs_gives_its_slot_back(world):
    """An overflow raised inside a reduction (``np.errstate(over="raise")``), on every rank
    alike: the slot goes back, and 5000 correct collectives follow (a leaked slot made
    exactly the 4096th later one raise that 4096 collectives were in flight). The ring:
    every rank reduces in its first round, so all fail alike and stay in step."""
    n = world.Get_size()
    comm = world.Dup()
    huge = np.full(2 * n, np.finfo(np.float64).max)
    failures = [
        lambda: mpidp.allreduce(comm, huge, np.empty_like(huge), algorithm="ring"),
        lambda: mpidp.iallreduce(comm, huge, np.empty_like(huge), algorithm="ring").wait(),
        lambda: mpidp.Comm(comm).Allreduce(huge, np.empty_like(huge), algorithm="ring"),
        lambda: mpidp.reduce_scatter(comm, huge, np.empty(2), algorithm="ring"),
    ]
    for fail in failures:
        with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow"):
            fail()
    req = mpidp.iallreduce(comm, huge, np.empty_like(huge), algorithm="ring")
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        req.wait()
    with pytest.raises(RuntimeError, match="failed earlier"):  # never reported complete
        req.wait()
    x, y = np.ones(1), np.empty(1)
    before = checks.debug_enabled()
    checks.set_debug(False)  # (time: the check's own exchange would double each call)
    try:
        for k in range(5000):
            if k % 2:
                mpidp.allreduce(comm, x, y, algorithm="ring")
            else:
                mpidp.iallreduce(comm, x, y, algorithm="recursive_doubling").wait()
            assert y[0] == n, k
    finally:
        checks.set_debug(before)
    assert not state.state(comm)._busy, "a failed collective kept its slot"
    comm.Free()


def check_a_persistent_collective_whose_start_raises_can_start_again(world):
    """A start that raises (recorded, or replayed) fails: Wait raises again, it is no
    longer active, the next start runs it whole (a run recorded part way is not
    replayed), and Free works."""
    comm = world.Dup()
    huge = np.full(2 * comm.Get_size(), np.finfo(np.float64).max)
    out = np.empty_like(huge)
    req = mpidp.allreduce_init(comm, huge, out, algorithm="ring")
    for start in ("recorded", "replayed"):
        req.Start()
        with np.errstate(over="raise"), pytest.raises(FloatingPointError):
            req.Wait()
        with pytest.raises(RuntimeError, match="failed earlier"):
            req.Wait()
        with pytest.raises(RuntimeError, match="failed earlier"):
            req.Test()
        assert (req.request is req.replay) == (start == "replayed"), start
        out[:] = 0
        req.Start()  # failed, so not active: it starts again, whole
        req.Wait()
        assert np.all(np.isinf(out)), (start, out)
    assert req.request is req.replay, "a complete recorded run is replayed"
    req.Free()
    comm.Free()


# One launch for the collectives that raise (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[3], timeout=180)
def test_collectives_that_raise_give_their_slot_back_and_two_threads_at_once_raise(mpi_ranks):
    """Two threads starting collectives at once on rank 0 raise there, the others end at
    their deadline; a collective that raises while it runs gives its slot back; a persistent
    one whose start raises can start again (N = 2, 3 each)."""
    on_each_size((2, 3), patched(
        check_two_threads_at_once_raise_there_and_the_others_end_at_their_deadline))
    on_each_size((2, 3), check_a_collective_that_raises_while_it_runs_gives_its_slot_back)
    on_each_size((2, 3), check_a_persistent_collective_whose_start_raises_can_start_again)
