"""Several rank counts in one MPI launch: a communicator of each size, split off COMM_WORLD.

Each launch costs every rank its start-up (Python, NumPy, mpi4py, pytest, the test module:
about 0.7 s of CPU a rank), and on the suite's 2 cores the ranks of N = 1..8 launched one
job each are 36 start-ups. One job of 8 ranks that runs the same check on a communicator
of 1, 2, ..., 8 of its ranks is 8: the check sees a real MPI communicator of that size,
and the MPI library's own collectives on it are the oracle, as on COMM_WORLD.

    @pytest.mark.mpi(ranks=[8], timeout=...)
    def test_x(mpi_ranks):
        on_each_size(range(1, 9), check)     # check(comm) on the ranks of each size

The ranks left out of a size wait for the others without taking a core from them (a
nonblocking all-reduce polled with sleeps: MPICH's blocking calls spin). After each size
the ranks agree whether it failed anywhere: the ranks where the check raised raise it,
every other rank raises an error naming the size and the failed ranks, so the job ends
at once. (A rank still waiting inside the check for a rank that raised is cut off by the
harness's watchdog, as in any multi-rank test.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np
from mpi4py import MPI


def idle_allreduce(comm, flags: np.ndarray, poll_s: float = 0.002) -> np.ndarray:
    """MAX of `flags` over `comm`, polled with sleeps, so waiting ranks leave the cores free."""
    out = np.empty_like(flags)
    req = comm.Iallreduce(flags, out, op=MPI.MAX)
    while not req.Test():
        time.sleep(poll_s)
    return out


def on_each_size(sizes: Iterable[int], check: Callable, world=None) -> None:
    """``check(comm)`` for each size n, on a communicator of `world`'s ranks 0..n-1 (freed
    after); every rank of `world` must call this, as with any collective. Sizes above
    ``world.Get_size()`` are an error, not skipped."""
    world = MPI.COMM_WORLD if world is None else world
    sizes, rank = list(sizes), world.Get_rank()
    if max(sizes, default=0) > world.Get_size():
        raise ValueError(f"sizes {sizes} need {max(sizes)} ranks, the job has "
                         f"{world.Get_size()}")
    for n in sizes:
        inside = rank < n
        sub = world.Split(0 if inside else MPI.UNDEFINED, rank)
        error = None
        if inside:
            try:
                check(sub)
            except BaseException as e:  # noqa: B036 (raised again below, after the others know)
                error = e
            else:
                sub.Free()
        raise_where_any_failed(world, error, n)


def raise_where_any_failed(world, error: BaseException | None, n: int) -> None:
    """After the check of size `n`: every rank learns whether any failed (an idle all-reduce
    of one flag each), then raises its own `error`, or an AssertionError naming the ranks
    that failed, so that no rank runs ahead into the next size while another has stopped."""
    rank = world.Get_rank()
    failed = np.zeros(world.Get_size(), np.int8)
    failed[rank] = error is not None
    failed = idle_allreduce(world, failed)
    if error is not None:
        raise error
    if failed.any():
        raise AssertionError(f"N={n}: the check failed on rank(s) "
                             f"{np.flatnonzero(failed).tolist()} (their reports say how)")
