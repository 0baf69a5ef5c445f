"""mpidp.torch's Work: async_op, futures, wait(timeout), the group's timeout, progress.

One launch of 2 ranks for all of it: the checks run in order on the same groups. The
agreement check (MPIDP_DEBUG) is off: it makes a collective's start wait for every rank
(a blocking exchange of the arguments), and these tests start collectives that a peer
joins late or never.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: "
                            "make setup installs it)")
import torch.distributed as dist  # noqa: E402
from helpers.torchgroups import start  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpidp.torch  # noqa: E402


def completes_while_the_caller_computes(group):
    """No call into the backend after the start: the progress thread alone completes
    the collective while the main thread multiplies matrices (torch: the GIL released)."""
    t = torch.ones(1 << 18)  # 1 MiB
    work = dist.all_reduce(t, group=group, async_op=True)
    a = torch.randn(256, 256)
    deadline = time.monotonic() + 60
    while not work.get_future().done() and time.monotonic() < deadline:
        a = torch.tanh(a @ a)
    assert work.get_future().done(), "the collective did not complete without a wait"
    assert work.completed_at is not None and work.completed_at >= work.started
    assert bool((t == 2).all())
    work.wait()


def future_callbacks_see_the_result(group):
    t = torch.full((4,), float(dist.get_rank(group) + 1))
    fut = dist.all_reduce(t, group=group, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert doubled.wait().tolist() == [6.0] * 4


def wait_timeout_leaves_the_work_in_flight(group, rank):
    """Rank 1 joins late: rank 0's wait(timeout) raises TimeoutError, the work stays in
    flight, and completes once rank 1 joins."""
    t = torch.ones(3)
    if rank == 0:
        work = dist.all_reduce(t, group=group, async_op=True)
        with pytest.raises(TimeoutError, match="all_reduce not complete after 0.2 s"):
            work.wait(timeout=timedelta(seconds=0.2))
        MPI.COMM_WORLD.Barrier()  # now rank 1 joins
        assert work.wait() and t.tolist() == [2.0] * 3
    else:
        MPI.COMM_WORLD.Barrier()
        dist.all_reduce(t, group=group)
        assert t.tolist() == [2.0] * 3


def group_timeout_is_the_deadline(rank):
    """A group made with timeout=1 s: a collective rank 1 never joins fails on rank 0 with
    TimeoutError naming it, through wait() and through the future alike."""
    group = dist.new_group([0, 1], backend="mpidp", timeout=timedelta(seconds=1))
    if rank == 0:
        work = dist.broadcast(torch.zeros(2), group_src=1, group=group, async_op=True)
        with pytest.raises(TimeoutError, match="broadcast not complete after 1.0 s"):
            work.wait()
        with pytest.raises(Exception, match="broadcast not complete"):
            work.get_future().wait()
    MPI.COMM_WORLD.Barrier()  # rank 1 never starts it (the group is not used again)


def options_reach_the_collectives(rank):
    """pg_options=Options(algorithm=...): the name each collective runs with."""
    group = dist.new_group([0, 1], backend="mpidp",
                           pg_options=mpidp.torch.Options("ring", debug=True))
    pg = group if isinstance(group, mpidp.torch.ProcessGroup) else None
    assert pg is not None and pg.options.for_collective("allreduce") == "ring"
    assert pg.options.for_collective("bcast") == "auto"  # bcast has no ring
    t = torch.ones(5)
    dist.all_reduce(t, group=group)
    assert t.tolist() == [2.0] * 5
    with pytest.raises(ValueError, match="unknown algorithm 'rign'"):
        mpidp.torch.Options("rign")


@pytest.mark.mpi(ranks=[2], timeout=240)
def test_works_futures_timeouts_and_progress(mpi_ranks, no_debug_check):
    start()
    rank = dist.get_rank()
    group = dist.group.WORLD
    completes_while_the_caller_computes(group)
    future_callbacks_see_the_result(group)
    wait_timeout_leaves_the_work_in_flight(group, rank)
    options_reach_the_collectives(rank)
    group_timeout_is_the_deadline(rank)
