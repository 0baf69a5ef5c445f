"""The driver: a schedule's rounds run in order, and its `Request` (`mpidp.Request`), which
completes alongside mpi4py's own; the public behaviour only.

``req.Wait()``, ``req.Test()``, and `mpidp.Request`'s Waitall/Testall/Waitany/
Testany/Waitsome/Testsome over lists that mix mpidp's requests with mpi4py's
(which mpi4py's own functions refuse); a request reported complete is inactive,
as an MPI request becomes ``MPI.REQUEST_NULL``; ``Cancel`` is refused, as MPI
refuses it for a collective, and ``Free`` is honoured once the collective is
complete and refused while it is in flight, both with an ``MPI.Exception``.
mpi4py's own ``MPI.Request.Waitall`` refuses mpidp's requests; `Request.Waitall` and
`mpidp.waitall` take them. At the end, in one process: `run` and `Handle` (= `Request`)
on a one-rank schedule.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from mpi4py import MPI

import mpidp
from mpidp import Request
from mpidp.collectives.algorithms.rounds import Recv, Send
from mpidp.collectives.engine.driver import Handle, run


def start(comm, world, x, outs):
    """Three mpidp collectives, then a message around the ring: the list to complete."""
    n, rank = world.Get_size(), world.Get_rank()
    requests = [comm.Iallreduce(x, outs[0]), comm.Iallgather(x[:1], outs[1][:n]),
                comm.Ibcast(outs[2], root=n - 1)]
    inbox = np.full(1, -1, "i")
    requests += [world.Irecv(inbox, (rank - 1) % n, tag=7),
                 world.Isend(np.array([rank], "i"), (rank + 1) % n, tag=7)]
    return requests, inbox


def check(world, x, outs, inbox):
    n, rank = world.Get_size(), world.Get_rank()  # x is 1 + rank everywhere
    assert np.array_equal(outs[0], np.full(4, n * (n + 1) / 2))
    assert np.array_equal(outs[1][:n], np.arange(1.0, n + 1))
    assert np.array_equal(outs[2], np.full(4, float(n - 1)))
    assert inbox[0] == (rank - 1) % n


def check_any_and_some_over_mixed_requests(world):
    """Each request is reported complete exactly once, then skipped, as MPI does."""
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.Comm(world)
    x = np.full(4, 1.0 + rank)
    for how in ("Waitany", "Testany", "Waitsome", "Testsome"):
        outs = [np.zeros(4), np.zeros(n + 1), np.full(4, float(rank))]
        requests, inbox = start(comm, world, x, outs)
        with pytest.raises(TypeError):  # mpi4py's own functions take MPI requests only
            getattr(MPI.Request, how)(requests)
        reported = []
        while True:
            if how == "Waitany":
                index = Request.Waitany(requests)
                active, done = index != MPI.UNDEFINED, [index]
            elif how == "Testany":  # (UNDEFINED, True): none active; (UNDEFINED, False): wait
                index, flag = Request.Testany(requests)
                active, done = index != MPI.UNDEFINED or not flag, [index]
            else:  # None: none active; a list, empty for Testsome if none is done yet
                done = getattr(Request, how)(requests)
                active = done is not None
            if not active:
                break
            reported += [i for i in done if i != MPI.UNDEFINED]
            os.sched_yield()  # ranks share cores: a rank that spins starves its peers
        assert sorted(reported) == list(range(5)), (how, reported)
        check(world, x, outs, inbox)
        assert not any(requests)  # all inactive, mpidp's and MPI's alike
        assert Request.Waitany(requests) == MPI.UNDEFINED
        assert Request.Testany(requests) == (MPI.UNDEFINED, True)
        assert Request.Waitsome(requests) is None and Request.Testsome(requests) is None
        assert all(r.Test() for r in requests) and all(r.Wait() for r in requests)


def check_wait_test_waitall_testall(world):
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.Comm(world)
    x = np.full(4, 1.0 + rank)
    for how in ("Wait", "Test", "Waitall", "Testall"):
        outs = [np.zeros(4), np.zeros(n + 1), np.full(4, float(rank))]
        requests, inbox = start(comm, world, x, outs)
        if how == "Wait":  # in the order started: every rank reaches the same one next
            assert all([r.Wait() for r in requests])
        elif how == "Test":
            while not all([r.Test() for r in requests]):
                os.sched_yield()
        elif how == "Waitall":
            assert Request.Waitall(requests) is True
        else:
            while not Request.Testall(requests):
                os.sched_yield()
        check(world, x, outs, inbox)
        assert not any(requests), how


def check_cancel_is_refused_and_free_only_once_complete(world):
    """(No MPIDP_DEBUG check: it would make the start wait for the other ranks.)"""
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.Comm(world)
    x, y, z = np.ones(1000), np.empty(1000), np.empty(1000)
    # Cancel: MPI does not cancel a collective; MPICH and Open MPI raise MPI.Exception
    # (Open MPI not on one rank, where the collective is over as it starts; mpidp still does)
    for c, out in ((world, y), (comm, z)):
        request = c.Iallreduce(x, out)
        if n > 1 or c is comm:
            with pytest.raises(MPI.Exception):
                request.Cancel()
        request.Wait()
    assert np.array_equal(y, z)
    # Free in flight: refused (rank 1 has not started it yet, so it cannot be complete)
    if rank == 0:
        request = comm.Iallreduce(x, y)
        if n > 1:
            with pytest.raises(MPI.Exception, match="in flight"):
                request.Free()
    world.Barrier()
    if rank != 0:
        request = comm.Iallreduce(x, y)
    request.Wait()
    assert np.array_equal(y, x * n) and not request
    # Free after Wait: the request is already released, as MPI's is (MPI.REQUEST_NULL)
    for c in (world, comm):
        request = c.Iallreduce(x, y)
        request.Wait()
        with pytest.raises(MPI.Exception):
            request.Free()
    # Free once complete but not yet reported (Get_status does not release): honoured
    request = comm.Iallreduce(x, y)
    while not request.Get_status():
        os.sched_yield()
    assert request
    request.Free()
    assert not request and request.Test() and request.Wait()


def test_schedule_runs_rounds_in_order_and_counts_them():
    """A one-rank 'exchange with myself' schedule, blocking and nonblocking."""
    comm = MPI.COMM_SELF
    log = []

    def rounds(buf, tmp):
        for step in range(3):
            yield [Send(buf, 0), Recv(tmp, 0)]
            buf += tmp  # local work happens after the round completes
            log.append(step)

    buf, tmp = np.ones(4), np.empty(4)
    assert run(comm, rounds(buf, tmp), tag=5) == 3
    assert log == [0, 1, 2] and np.array_equal(buf, [8.0] * 4)
    log.clear()
    done = []
    h = Handle(comm, rounds(buf, tmp), tag=5, on_done=lambda: done.append(True))
    while not h.test():
        pass
    assert h.done and h.rounds == 3 and done == [True]
    assert np.array_equal(buf, [64.0] * 4)
    h.wait()  # waiting on a finished handle is a no-op


def test_requests_are_not_mpi4py_requests():
    """MPI.Request.Waitall refuses mpidp's requests; Request.Waitall and mpidp.waitall take them."""
    comm = mpidp.Comm(MPI.COMM_WORLD)
    x, y = np.ones(4), np.empty(4)
    requests = [comm.Iallreduce(x, y), comm.Ibcast(x)]
    with pytest.raises(TypeError):
        MPI.Request.Waitall(requests)
    assert Request.Waitall(requests) is True
    mpidp.waitall(requests)
    assert mpidp.testall(requests) and Request.Testall(requests)
    assert requests[0].Test() and requests[0].Wait() is True and requests[0].Get_status()
    assert (y == x).all()


def check_wait_round_completes_a_collective_from_another_thread(comm):
    """What DataParallel's "wait" progress thread calls: a round at a time, blocking in
    MPI, until done; the persistent collective's replay (its second start on) too. The
    main thread makes no MPI call meanwhile; the results are the native Allreduce's."""
    import threading

    x = np.arange(1000.0) * (comm.Get_rank() + 1)
    expect = np.empty_like(x)
    comm.Allreduce(x, expect)
    pout = np.empty_like(x)
    persistent = mpidp.allreduce_init(comm, x, pout, algorithm="ring")
    for start in range(3):
        out = np.empty_like(x)
        if start == 0:
            request = mpidp.iallreduce(comm, x, out, algorithm="ring")
        else:
            persistent.Start()
            request, out = persistent.request, pout
        rounds = []

        def drive(request=request, rounds=rounds):
            while not request.wait_round():
                rounds.append(1)

        thread = threading.Thread(target=drive)
        thread.start()
        thread.join(30)
        assert not thread.is_alive() and request.done
        assert len(rounds) == max(0, 2 * (comm.Get_size() - 1) - 1)  # ring: 2(N-1) rounds
        np.testing.assert_array_equal(out, expect)
    persistent.Free()


def check_freeing_the_comm_with_a_collective_in_flight(world):
    """MPI_Comm_free lets pending operations complete. mpidp.Comm's Free does that for its
    collectives in flight (Wait afterwards returns MPI's result); a raw mpi4py comm's Free
    cannot be intercepted, so the request's next round raises one clear MPI.Exception
    (ERR_COMM) saying so, instead of MPI's "Invalid communicator", and fails cleanly."""
    n, rank = world.Get_size(), world.Get_rank()
    x = np.arange(10_000, dtype=np.float64) * (rank + 1)
    want = np.empty_like(x)
    world.Allreduce(x, want)
    for algorithm in ("ring", "recursive_doubling"):
        dup = world.Dup()
        c = mpidp.Comm(dup, algorithm=algorithm)
        y = np.empty_like(x)
        request = c.Iallreduce(x, y)
        c.Free()
        assert dup == MPI.COMM_NULL
        request.Wait()
        np.testing.assert_array_equal(y, want)

        if algorithm != "ring":  # the ring's first round needs no peer's later one
            continue
        dup = world.Dup()
        request = mpidp.iallreduce(dup, x, np.empty_like(x), algorithm=algorithm)
        if request.done:  # one rank: nothing was ever in flight
            dup.Free()
            assert n == 1 and request.Wait()
            continue
        # every rank's first round complete, the next not posted: so that no rank is left
        # waiting for a peer's round that cannot be posted any more (white box: its requests)
        MPI.Request.Waitall(request._reqs)
        dup.Free()
        with pytest.raises(MPI.Exception, match=r"freed \(comm.Free\(\)\) while this mpidp "
                                                "collective was in flight") as raised:
            request.Wait()
        assert raised.value.Get_error_class() == MPI.ERR_COMM
        with pytest.raises(RuntimeError, match="failed earlier"):  # it never completes
            request.Wait()
    world.Barrier()


# Every multi-rank check in one launch (a launch of ranks costs seconds of start-up).

@pytest.mark.mpi(ranks=[3], timeout=120)
def test_requests_complete_alongside_mpi4pys_cancel_free_and_wait_round(mpi_ranks):
    """Waitany/Testany/Waitsome/Testsome and Wait/Test/Waitall/Testall over mixed lists
    (N = 1, 3); Cancel refused and Free only once complete (N = 1, 2); `wait_round` from
    another thread (N = 1, 2, 3)."""
    on_each_size((1, 3), check_any_and_some_over_mixed_requests)
    on_each_size((1, 3), check_wait_test_waitall_testall)
    with debug_check_off():  # its exchange would make the start wait for the other ranks
        on_each_size((1, 2), check_cancel_is_refused_and_free_only_once_complete)
    on_each_size((1, 2, 3), check_wait_round_completes_a_collective_from_another_thread)
    on_each_size((1, 3), check_freeing_the_comm_with_a_collective_in_flight)
