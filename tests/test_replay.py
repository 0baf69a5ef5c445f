"""Replayed persistent collectives: the first start recorded, every later one replayed.

Every all-reduce algorithm, in place and out of place, on 1 to 8 ranks and counts
of every shape, is started again and again with new data in its buffers; each
result is compared with the MPI library's own on the same inputs, and where the
plan is replayable the test checks that the replay, not the generator, ran.

Every rank count runs in one launch of 8 ranks (a communicator of each size:
tests/helpers/subcomms.py).
"""

import os

import numpy as np
import pytest
from helpers.oracle import assert_same, counts_for, make_input, native_allreduce
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from mpi4py import MPI

import mpidp
from mpidp.collectives.algorithms import entry
from mpidp.collectives.dropin.counting import CountingComm
from mpidp.collectives.engine.driver import Request
from mpidp.collectives.engine.replay import Replay, replayable

STARTS = 4


def check(comm, count: int, algorithm: str, in_place: bool, op: str, dtype: str) -> None:
    """STARTS starts with new data each; odd starts completed by Test() alone."""
    x, y = np.empty(count, dtype), np.empty(count, dtype)
    req = mpidp.allreduce_init(comm, mpidp.IN_PLACE if in_place else x, y, op=op,
                               algorithm=algorithm)
    replays = replayable(req.plan)
    if (comm.Get_size() > 1 and algorithm not in ("direct", "auto") and count
            and (in_place or algorithm != "naive")):
        assert replays, f"{algorithm} in_place={in_place} should be replayed"
    for start in range(STARTS):
        x[...] = make_input(op, dtype, count, comm.Get_rank(), seed=start)
        if in_place:
            y[...] = x
        req.Start()
        if start % 2:
            while not req.Test():  # round by round, never blocking
                os.sched_yield()  # 8 ranks share 2 cores: a rank that spins starves its peers
        else:
            req.Wait()
        assert type(req.request) is (Replay if replays and start else Request)
        assert_same(y, native_allreduce(comm, x, op),
                    f"{algorithm} {op} {dtype} count={count} start={start} in_place={in_place}")
    req.Free()


def check_start_after_start(comm):
    n = comm.Get_size()
    for count in counts_for(n) + ([100_003] if n in (3, 4) else []):
        for algorithm in mpidp.ALGORITHMS["allreduce"]:
            for in_place in (True, False):
                check(comm, count, algorithm, in_place, "sum", "int64")
        check(comm, count, "ring", count % 2 == 0, "avg", "float64")  # finish recorded too
        check(comm, count, "rabenseifner", count % 2 == 1, "max", "int32")


def check_plain_calls_in_flight(world):
    comm = world.Dup()
    n, rank = comm.Get_size(), comm.Get_rank()
    x = np.empty(2 * n + 1)
    ys, zs = np.empty((2, x.size)), np.empty((2, x.size))
    reqs = [mpidp.allreduce_init(comm, x, y, algorithm=a)
            for y, a in zip(ys, ("ring", "recursive_doubling"), strict=True)]
    for start in range(5):
        x[...] = make_input("sum", "float64", x.size, rank, seed=start)
        plain = []
        for req, z in zip(reqs, zs, strict=True):  # a plain call started after each start
            req.Start()
            plain.append(mpidp.iallreduce(comm, x, z, algorithm="rabenseifner"))
        # completed in an order of their own, alternating
        order = [reqs[0], plain[1], reqs[1], plain[0]] if start % 2 else [*plain[::-1], *reqs]
        mpidp.waitall(order)
        want = native_allreduce(comm, x, "sum")
        for out in (*ys, *zs):
            assert_same(out, want, f"start={start}")
    assert all(type(req.request) is Replay for req in reqs)
    for req in reqs:
        req.Free()
    comm.Free()


def check_a_replayed_start_does_not_wait_and_honours_timeouts(world):
    comm = world.Dup()
    rank = comm.Get_rank()
    x = np.full(8, rank + 1.0)
    req = mpidp.allreduce_init(comm, mpidp.IN_PLACE, x, algorithm="ring")
    req.Start()
    req.Wait()  # recorded
    x[...] = rank + 1.0
    if rank == 0:
        req.Start()  # replayed: returns although the peer has not started
        assert not req.Test()
        with pytest.raises(TimeoutError):
            req.request.wait(timeout=0.2)  # still in flight afterwards
        comm.Barrier()
    else:
        comm.Barrier()
        req.Start()
    req.Wait()
    assert isinstance(req.request, Replay) and np.array_equal(x, np.full(8, 3.0))
    mpi_reqs = [r for reqs, _ in req.request.steps for r in reqs]
    assert mpi_reqs
    req.Free()
    assert all(r == MPI.REQUEST_NULL for r in mpi_reqs)  # the persistent requests freed
    comm.Free()


def check_a_comm_like_keeps_the_generator_and_sees_every_message(comm):
    counting = CountingComm(comm)
    x = np.ones(10)
    req = mpidp.allreduce_init(counting, mpidp.IN_PLACE, x, algorithm="ring")
    sent = []
    for _ in range(3):
        x[...] = 1.0
        counting.reset()
        req.Start()
        req.Wait()
        sent.append(counting.totals()[1])
        assert type(req.request) is Request
        assert np.array_equal(x, np.full(10, float(counting.Get_size())))
    assert sent[0] > 0 and len(set(sent)) == 1
    req.Free()


# Every rank count in one launch (a launch of 8 ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[8], timeout=300)
def test_replayed_allreduce_matches_mpi_start_after_start(mpi_ranks):
    on_each_size(range(1, 9), check_start_after_start)


@pytest.mark.mpi(ranks=[8], timeout=180)
def test_replays_with_plain_calls_in_flight_timeouts_and_comm_likes(mpi_ranks):
    """Plain calls in flight between replayed starts (N = 2, 3, 5); a replayed start that
    does not wait for its peer (N = 2); a comm-like that keeps the generator (N = 2, 3)."""
    on_each_size((2, 3, 5), check_plain_calls_in_flight)
    on_each_size((2,), check_a_replayed_start_does_not_wait_and_honours_timeouts)
    with debug_check_off():  # the agreement check's own messages would be counted
        on_each_size((2, 3), check_a_comm_like_keeps_the_generator_and_sees_every_message)


def test_what_is_replayed():
    comm = MPI.COMM_SELF
    x, y = np.zeros(3), np.zeros(3)
    for algo, send, replays in (("ring", x, False), ("ring", mpidp.IN_PLACE, True),
                                ("naive", mpidp.IN_PLACE, True), ("direct", mpidp.IN_PLACE, False)):
        req = mpidp.allreduce_init(comm, send, y, algorithm=algo)
        assert replayable(req.plan) is replays, algo  # one rank out of place: a copy first
        req.Free()
    assert not entry("allreduce", "direct").replayable


def test_replay_asks_the_plan_for_its_algorithm_and_source_not_the_registry_or_its_args():
    """`replayable` reads `Plan.algorithm` and `Plan.src`: a plan whose rounds are not its
    registered algorithm's (the generator looked up in the registry would say otherwise),
    or whose arguments are laid out another way, is judged by what it says it runs."""
    from mpidp.collectives.plan import Call, Plan

    call = Call(MPI.COMM_SELF, None, False)
    naive = entry("allreduce", "naive")  # replayable "in place"
    try:
        x = np.zeros(3)
        assert replayable(Plan(call, naive.rounds, (), 0, algorithm=naive, src=None))
        assert not replayable(Plan(call, naive.rounds, (x, x, x, x, x, None), 0,
                                   algorithm=naive, src=x))  # out of place: it copies
        assert not replayable(Plan(call, naive.rounds, (), 0))  # the call path's own rounds
        ring = entry("allreduce", "ring")
        assert replayable(Plan(call, ring.rounds, (), 0, algorithm=ring, src=x))
    finally:
        call.end()
