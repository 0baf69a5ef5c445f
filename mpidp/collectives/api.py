"""Entry points: every collective as a function, its I-form and its persistent form.

    allreduce(comm, sendbuf, recvbuf, op, algorithm)       blocking: start, then wait
    iallreduce(comm, sendbuf, recvbuf, op, algorithm)      -> Request (test(), wait())
    allreduce_init(comm, sendbuf, recvbuf, op, algorithm)  -> Persistent (Start(), Wait())

and the same for reduce-scatter, all-gather and broadcast, and the exact (or
ordered) sums of parts. Each is one line: `plan.planned` makes the collective's plan (`plans`,
`exact`: the checks, the algorithm, the buffers, the tag), then the plan runs
(`Plan.run`), starts (`Plan.start`) or is kept for many starts (`Persistent`).
The blocking all-reduce, all-gather and broadcast first ask `blocking` to replay a
record of the same call, and have one made after a call they planned (`schedules`).
`mpidp.Comm` makes the same plans from mpi4py's buffer specs (`dropin`).

Arguments are NumPy or CuPy arrays; ``sendbuf=IN_PLACE`` means the input is in
``recvbuf``, as in MPI. Integer arguments (root, counts, displacements) are taken
as the ints they are (``np.int64(1)`` is 1; ``1.0`` is a TypeError).

Any number of collectives may be in flight on one communicator, each with the
next tag of its sequence (`state`; ``tag=`` gives one of your own, below
``TAG_BASE``). Ranks that disagree cannot exchange data (the call's signature is
in its tags); ``MPIDP_DEBUG=1`` or ``debug=True`` makes every rank raise
``ValueError`` with what each rank passed (`checks.agree`), compared as passed
(``auto`` is not ``ring``) after the local checks and before anything collective.
"""

from __future__ import annotations

from mpi4py import MPI

from . import blocking
from .algorithms import ALGORITHMS  # noqa: F401 (mpidp.ALGORITHMS: each collective's names)
from .checks import check_algorithm  # noqa: F401 (mpidp.check_algorithm)
from .cost import choose  # noqa: F401 (api.choose: what "auto" picks)
from .engine.driver import Request
from .exact_parts import plan_parts, plan_parts_rs
from .persistent import Persistent
from .plan import planned
from .plans import (
    IN_PLACE,  # noqa: F401 (mpidp.IN_PLACE)
    plan_allgather,
    plan_allreduce,
    plan_bcast,
    plan_reduce_scatter,
)
from .state import TAG_BASE  # noqa: F401 (mpidp.TAG_BASE)

# ------------------------------------------------------------ all-reduce


def allreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", **kw) -> None:
    """All-reduce: every rank's `recvbuf` gets the reduction of all ranks' `sendbuf`.

    Keywords: ``tag`` (your own, below ``TAG_BASE``), ``debug`` (check that ranks agree).
    A call like an earlier one replays its recorded schedule (`blocking`).
    """
    replayed = False if kw else blocking.allreduce(comm, sendbuf, recvbuf, op, algorithm)
    if not replayed:
        planned(plan_allreduce, comm, sendbuf, recvbuf, op, algorithm, **kw).run()
        if replayed is None:  # no record of this call yet: one is made now
            blocking.record("allreduce", comm, sendbuf, recvbuf, op, algorithm)


def iallreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", **kw) -> Request:
    """Start an all-reduce; returns a Request (`test()`, `wait()`)."""
    return planned(plan_allreduce, comm, sendbuf, recvbuf, op, algorithm, **kw).start()


def allreduce_init(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto",
                   **kw) -> Persistent:
    """A persistent all-reduce: ``req.Start()``, then ``req.Wait()``, as often as needed."""
    return Persistent(planned(plan_allreduce, comm, sendbuf, recvbuf, op, algorithm,
                              persistent=True, **kw))


# ------------------------------------------------------------ reduce-scatter


def reduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                   algorithm: str = "auto", **kw) -> None:
    """Reduce-scatter; see `plans.plan_reduce_scatter`."""
    planned(plan_reduce_scatter, comm, sendbuf, recvbuf, recvcounts, op, algorithm, **kw).run()


def ireduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                    algorithm: str = "auto", **kw) -> Request:
    """Start a reduce-scatter; returns a Request."""
    return planned(plan_reduce_scatter, comm, sendbuf, recvbuf, recvcounts, op, algorithm,
                   **kw).start()


def reduce_scatter_init(comm, sendbuf, recvbuf, recvcounts, op=MPI.SUM,
                        algorithm: str = "auto", **kw) -> Persistent:
    """A persistent reduce-scatter with per-rank counts (``MPI_Reduce_scatter_init``)."""
    return Persistent(planned(plan_reduce_scatter, comm, sendbuf, recvbuf, recvcounts, op,
                              algorithm, persistent=True, **kw))


def reduce_scatter_block_init(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto",
                              **kw) -> Persistent:
    """A persistent reduce-scatter of equal blocks (``MPI_Reduce_scatter_block_init``)."""
    return Persistent(planned(plan_reduce_scatter, comm, sendbuf, recvbuf, None, op, algorithm,
                              persistent=True, **kw))


# ------------------------------------------------------------ all-gather


def allgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
              algorithm: str = "auto", **kw) -> None:
    """All-gather; see `plans.plan_allgather`. Equal blocks (no counts, no displs): a call
    like an earlier one replays its recorded schedule (`blocking`)."""
    plain = not kw and recvcounts is None and displs is None
    replayed = plain and blocking.allgather(comm, sendbuf, recvbuf, algorithm)
    if not replayed:
        planned(plan_allgather, comm, sendbuf, recvbuf, recvcounts, displs, algorithm,
                **kw).run()
        if replayed is None:
            blocking.record("allgather", comm, sendbuf, recvbuf, algorithm)


def iallgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
               algorithm: str = "auto", **kw) -> Request:
    """Start an all-gather; returns a Request."""
    return planned(plan_allgather, comm, sendbuf, recvbuf, recvcounts, displs, algorithm,
                   **kw).start()


def allgather_init(comm, sendbuf, recvbuf, algorithm: str = "auto", **kw) -> Persistent:
    """A persistent all-gather of equal blocks (``MPI_Allgather_init``)."""
    return Persistent(planned(plan_allgather, comm, sendbuf, recvbuf, None, None, algorithm,
                              persistent=True, **kw))


def allgatherv_init(comm, sendbuf, recvbuf, recvcounts, displs=None, algorithm: str = "auto",
                    **kw) -> Persistent:
    """A persistent all-gather with per-rank counts (``MPI_Allgatherv_init``)."""
    return Persistent(planned(plan_allgather, comm, sendbuf, recvbuf, recvcounts, displs,
                              algorithm, persistent=True, **kw))


# ------------------------------------------------------------ broadcast


def bcast(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> None:
    """Broadcast `buf` from `root`; a call like an earlier one replays its recorded
    schedule (`blocking`)."""
    replayed = False if kw else blocking.bcast(comm, buf, root, algorithm)
    if not replayed:
        planned(plan_bcast, comm, buf, root, algorithm, **kw).run()
        if replayed is None:
            blocking.record("bcast", comm, buf, root, algorithm)


def ibcast(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> Request:
    """Start a broadcast; returns a Request."""
    return planned(plan_bcast, comm, buf, root, algorithm, **kw).start()


def bcast_init(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> Persistent:
    """A persistent broadcast (``MPI_Bcast_init``)."""
    return Persistent(planned(plan_bcast, comm, buf, root, algorithm, persistent=True, **kw))


# ------------------------------------------------------------ exact sums of parts (`exact`)


def iallreduce_parts(comm, parts, out, *, addends: int, algorithm: str = "auto",
                     average: bool = False, ordered: bool = False, held=None,
                     **kw) -> Request:
    """Start the exact sum over all ranks of all arrays in `parts` into `out`.

    Args:
        parts: this rank's addends: arrays of out's size and dtype (float16/32/64); any
            number of them, none included. They are read until the request completes.
        out: the result, the same bits on every rank; it may be one of the parts.
        addends: the number of addends over all ranks, the same on every rank. The
            result is bitwise EXACT_SUM's over the same multiset of addends.
        algorithm: the all-reduce algorithm of the SUM pass (and of the MAX pass).
        average: divide by `addends` (EXACT_AVG).
        ordered: instead of the exact sum, the sum in rank order (rank 0's parts in
            their order, then rank 1's, ...), added item by item in the dtype
            (float16 in float32; ordered.py): the bits of that sequence of addends,
            however it is cut among ranks, at less than half the exact sum's cost.
        held: each rank's number of parts (a list, the same on every rank), where the
            caller knows them: the ranks need not swap them first.
        tag, debug: as for every collective.
    Returns: a Request (``test()``, ``wait()``).
    """
    return planned(plan_parts, comm, parts, out, addends, algorithm, average, ordered, held,
                   **kw).start()


def allreduce_parts(comm, parts, out, *, addends: int, algorithm: str = "auto",
                    average: bool = False, ordered: bool = False, held=None, **kw) -> None:
    """The blocking `iallreduce_parts`."""
    planned(plan_parts, comm, parts, out, addends, algorithm, average, ordered, held,
            **kw).run()


def allreduce_parts_init(comm, parts, out, *, addends: int, algorithm: str = "auto",
                         average: bool = False, ordered: bool = False, held=None,
                         **kw) -> Persistent:
    """A persistent `iallreduce_parts`: checked and planned once (the path, the scratch,
    the tag), then ``req.Start()``, ``req.Wait()`` as often as needed, each start summing
    what the parts hold then. The parts and `out` stay the arrays it was made with."""
    return Persistent(planned(plan_parts, comm, parts, out, addends, algorithm, average,
                              ordered, held, persistent=True, **kw))


def sum_parts(parts, out, *, average: bool = False, ordered: bool = False) -> None:
    """The local exact (or ordered) sum of `parts` into `out`: `allreduce_parts` on
    ``MPI.COMM_SELF``."""
    parts = list(parts)
    allreduce_parts(MPI.COMM_SELF, parts, out, addends=len(parts), average=average,
                    ordered=ordered)


def ireduce_scatter_parts(comm, parts, out, counts, *, addends: int, algorithm: str = "auto",
                          average: bool = False, ordered: bool = False, held=None,
                          **kw) -> Request:
    """Start the exact sum over all ranks of all `parts`, rank r getting block r into `out`.

    As `iallreduce_parts`, with the result scattered: block r (``counts[r]`` items, the
    blocks packed in rank order) is rank r's `out`. `out` may be the front of one of the
    parts (an in-place reduce-scatter's place): the parts are read before it is written.
    `algorithm` is a reduce-scatter name (``"ring"``, ``"recursive_halving"``, ``"auto"``).
    """
    return planned(plan_parts_rs, comm, parts, out, counts, addends, algorithm, average,
                   ordered, held, **kw).start()


def reduce_scatter_parts_init(comm, parts, out, counts, *, addends: int,
                              algorithm: str = "auto", average: bool = False,
                              ordered: bool = False, held=None, **kw) -> Persistent:
    """A persistent `ireduce_scatter_parts`, as `allreduce_parts_init` is `iallreduce_parts`'s."""
    return Persistent(planned(plan_parts_rs, comm, parts, out, counts, addends, algorithm,
                              average, ordered, held, persistent=True, **kw))
