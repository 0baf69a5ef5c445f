"""Comm: an mpi4py-compatible communicator whose buffer collectives run mpidp's algorithms.

Change one line of an mpi4py program::

    comm = MPI.COMM_WORLD                   # before
    comm = mpidp.Comm(MPI.COMM_WORLD)       # after

and its ``Allreduce``, ``Reduce_scatter_block``, ``Reduce_scatter``, ``Allgather``,
``Allgatherv`` and ``Bcast`` (and their ``I``-forms) run mpidp's point-to-point
algorithms, never the MPI library's collectives. Every other attribute is the
wrapped communicator's (``Get_rank``, ``Send``, ``Barrier``, ``comm.rank``, ...).

A call goes through three steps:

    buffer spec  --parse-->  typed 1-D view of the user's memory  --plans.plan_*-->  rounds
    [x, 3, MPI.INT]          x[:3] as int32, no copy                 run(), or a Request

1. Parse the buffer spec (`bufspec`) with mpi4py's rules (``message_simple`` and
   ``message_vector`` in mpi4py's msgbuffer.pxi): ``buf``, ``[buf, type]``,
   ``[buf, count, type]``, ``[buf, (count, displ), type]``,
   ``[buf, count, displ, type]``; for ``Allgatherv`` counts and displs are lists.
   A count given for ``Allgather``'s recvbuf (or ``Reduce_scatter_block``'s
   sendbuf) is per rank, as in MPI. The view shares memory with ``buf``, so the
   result lands in the user's buffer.
2. Check counts and types as mpi4py does (``ValueError`` before any message).
3. Hand the views to ``plans.plan_*``, the plans `mpidp.allreduce` and the other
   functions make (`plan.planned`), for the call that took the next tag of the wrapped
   communicator's sequence (`state`): collectives started through this Comm, through
   another wrapper of the same communicator or through the `mpidp` functions on it
   are numbered in one sequence, so any number may be in flight together. Keep your
   own point-to-point tags below ``mpidp.TAG_BASE``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from mpi4py import MPI

from .. import blocking, cost, plans
from ..algorithms import ALGORITHMS
from ..checks import check_algorithms
from ..engine.completion import waitall
from ..engine.driver import Request
from ..persistent import Persistent
from ..plan import planned
from ..plans import IN_PLACE
from ..state import state
from . import parse


class Comm:
    """An mpi4py-compatible intracommunicator whose buffer collectives are mpidp's.

    Args:
        comm: an mpi4py intracommunicator, or any object with its point-to-point
            methods (such as `CountingComm`).
        algorithm: a name from `mpidp.ALGORITHMS`, used by every collective that
            has it (the others use "auto"), or a dict ``{collective: name}``.
        debug: before each collective, check that all ranks passed the same
            count, dtype, op and algorithm (one small all-gather; see checks.py).
            ``MPIDP_DEBUG=1`` in the environment turns it on for every Comm.
    """

    def __init__(self, comm, algorithm: str | Mapping[str, str] = "auto", *,
                 debug: bool = False):
        if isinstance(comm, Comm):
            comm = comm.comm
        if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
            raise ValueError("cannot wrap MPI.COMM_NULL")
        state(comm)  # refuses an intercommunicator, wrapped in a comm-like or not
        check_algorithms(algorithm)
        self.comm = comm
        self.algorithm = dict(algorithm) if isinstance(algorithm, Mapping) else algorithm
        self.debug = debug

    # ------------------------------------------------------------ reductions

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm=None) -> None:  # noqa: N802
        """Every rank's recvbuf gets the reduction of all ranks' sendbuf (MPI_Allreduce)."""
        self._blocking("allreduce", parse.allreduce, algorithm, sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm=None) -> Request:  # noqa: N802
        """Start an Allreduce; returns a Request."""
        return self._call(parse.allreduce, self, sendbuf, recvbuf, op, algorithm).start()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *,  # noqa: N802
                             algorithm=None) -> None:
        """Rank r's recvbuf gets block r of the reduced sendbuf, equal blocks."""
        self._call(parse.reduce_scatter_block, self, sendbuf, recvbuf, op, algorithm).run()

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *,  # noqa: N802
                              algorithm=None) -> Request:
        """Start a Reduce_scatter_block; returns a Request."""
        plan = self._call(parse.reduce_scatter_block, self, sendbuf, recvbuf, op, algorithm)
        return plan.start()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *,  # noqa: N802
                       algorithm=None) -> None:
        """Rank r's recvbuf gets recvcounts[r] items of the reduced sendbuf."""
        self._call(parse.reduce_scatter, self, sendbuf, recvbuf, recvcounts, op, algorithm).run()

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *,  # noqa: N802
                        algorithm=None) -> Request:
        """Start a Reduce_scatter; returns a Request (recvcounts=None gathers them first)."""
        plan = self._call(parse.reduce_scatter, self, sendbuf, recvbuf, recvcounts, op, algorithm)
        return plan.start()

    # ------------------------------------------------------------ data movement

    def Allgather(self, sendbuf, recvbuf, *, algorithm=None) -> None:  # noqa: N802
        """Block r of every rank's recvbuf gets rank r's sendbuf (MPI_Allgather)."""
        self._blocking("allgather", parse.allgather, algorithm, sendbuf, recvbuf)

    def Iallgather(self, sendbuf, recvbuf, *, algorithm=None) -> Request:  # noqa: N802
        """Start an Allgather; returns a Request."""
        return self._call(parse.allgather, self, sendbuf, recvbuf, algorithm).start()

    def Allgatherv(self, sendbuf, recvbuf, *, algorithm=None) -> None:  # noqa: N802
        """Allgather with per-rank counts and displacements in the recvbuf spec."""
        self._call(parse.allgatherv, self, sendbuf, recvbuf, algorithm).run()

    def Iallgatherv(self, sendbuf, recvbuf, *, algorithm=None) -> Request:  # noqa: N802
        """Start an Allgatherv; returns a Request."""
        return self._call(parse.allgatherv, self, sendbuf, recvbuf, algorithm).start()

    def Bcast(self, buf, root: int = 0, *, algorithm=None) -> None:  # noqa: N802
        """Every rank's buf gets root's buf (MPI_Bcast)."""
        self._blocking("bcast", parse.bcast, algorithm, buf, root)

    def Ibcast(self, buf, root: int = 0, *, algorithm=None) -> Request:  # noqa: N802
        """Start a Bcast; returns a Request."""
        return self._call(parse.bcast, self, buf, root, algorithm).start()

    # ------------------------------------------------------------ persistent (MPI-4)

    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL, *,  # noqa: N802
                       algorithm=None) -> Persistent:
        """A persistent Allreduce: ``Start()``, ``Wait()``, as often as needed; ``Free()``."""
        return Persistent(self._call(parse.allreduce, self, sendbuf, recvbuf, op, algorithm,
                                     persistent=True))

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM,  # noqa: N802
                                  info=MPI.INFO_NULL, *, algorithm=None) -> Persistent:
        return Persistent(self._call(parse.reduce_scatter_block, self, sendbuf, recvbuf, op,
                                     algorithm, persistent=True))

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,  # noqa: N802
                            info=MPI.INFO_NULL, *, algorithm=None) -> Persistent:
        return Persistent(self._call(parse.reduce_scatter, self, sendbuf, recvbuf, recvcounts, op,
                                     algorithm, persistent=True))

    def Allgather_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *,  # noqa: N802
                       algorithm=None) -> Persistent:
        return Persistent(self._call(parse.allgather, self, sendbuf, recvbuf, algorithm,
                                     persistent=True))

    def Allgatherv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *,  # noqa: N802
                        algorithm=None) -> Persistent:
        return Persistent(self._call(parse.allgatherv, self, sendbuf, recvbuf, algorithm,
                                     persistent=True))

    def Bcast_init(self, buf, root: int = 0, info=MPI.INFO_NULL, *,  # noqa: N802
                   algorithm=None) -> Persistent:
        return Persistent(self._call(parse.bcast, self, buf, root, algorithm, persistent=True))

    # ------------------------------------------------------------ sequence and plan

    def _gather_counts(self, count: int) -> list[int]:
        """Every rank's `count`, by an mpidp all-gather (Reduce_scatter without recvcounts)."""
        counts = np.zeros(self.comm.Get_size(), dtype=np.int64)
        counts[self.comm.Get_rank()] = count
        self._call(self._plan, plans.plan_allgather, "allgather", None, IN_PLACE, counts).run()
        return counts.tolist()

    def _call(self, parse, *args, persistent: bool = False):
        """``parse(call, *args)`` for the next collective of the sequence (`plan.planned`,
        as the functions' plans).

        The call takes its number before its arguments are parsed: one that raises
        has used it up, on this rank as on the others.
        """
        return planned(parse, self.comm, *args, debug=self.debug, persistent=persistent)

    def _blocking(self, collective: str, parse, algorithm, *args) -> None:
        """A blocking call: replayed where it is like an earlier one (`blocking`, with
        mpi4py's checks), else planned, then recorded."""
        args = (*args, self._algorithm_for(collective, algorithm))
        replayed = False if self.debug else getattr(blocking, collective)(self.comm, *args,
                                                                          "mpi4py")
        if not replayed:
            self._call(parse, self, *args).run()
            if replayed is None:  # no record of this call yet: one is made now
                blocking.record(collective, self.comm, *args, checks="mpi4py")

    def _plan(self, call, plan, collective: str, algorithm, *args, **kwargs):
        """``plans.plan_<collective>(call, ...)`` with this Comm's algorithm."""
        return plan(call, *args, algorithm=self._algorithm_for(collective, algorithm), **kwargs)

    def _algorithm_for(self, collective: str, override) -> str:
        """The algorithm name for one call: a per-call override, else this Comm's setting."""
        if override is not None:
            return override  # the plan checks it against ALGORITHMS[collective]
        if isinstance(self.algorithm, Mapping):
            return self.algorithm.get(collective, "auto")
        names = ALGORITHMS.get(collective, ("auto",))
        return self.algorithm if self.algorithm in names else "auto"

    # ------------------------------------------------------------ new communicators

    def _wrap(self, newcomm, same_ranks: bool = False):
        """A communicator made from this one, wrapped with the same settings.

        A duplicate (`same_ranks`) has the same ranks on the same links, so it
        inherits the cost model: no second calibration.
        """
        if newcomm == MPI.COMM_NULL or (isinstance(newcomm, MPI.Comm) and newcomm.Is_inter()):
            return newcomm
        if same_ranks:
            state(newcomm).inherit(state(self.comm))
        return Comm(newcomm, self.algorithm, debug=self.debug)

    def Dup(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Dup(*args, **kwargs), same_ranks=True)

    def Dup_with_info(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Dup_with_info(*args, **kwargs), same_ranks=True)

    def Idup(self, *args, **kwargs) -> tuple:  # noqa: N802
        newcomm, request = self.comm.Idup(*args, **kwargs)
        return self._wrap(newcomm, same_ranks=True), request

    def Clone(self) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Clone(), same_ranks=True)

    def Split(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Split(*args, **kwargs))

    def Split_type(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Split_type(*args, **kwargs))

    def Create(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Create(*args, **kwargs))

    def Create_group(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Create_group(*args, **kwargs))

    def Free(self) -> None:  # noqa: N802
        """MPI_Comm_free, once mpidp's collectives in flight on it are complete: MPI lets
        pending operations complete, and mpidp's post their rounds as they go."""
        waitall(list(state(self.comm).requests.values()))
        self.comm.Free()

    # ------------------------------------------------------------ everything else

    def __getattr__(self, name: str):
        if name == "comm":  # not set yet (copy, unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self.comm, name)

    def __eq__(self, other) -> bool:
        return self.comm == (other.comm if isinstance(other, Comm) else other)

    __hash__ = None  # as mpi4py's communicators

    def __bool__(self) -> bool:
        return bool(self.comm)

    def __repr__(self) -> str:
        return f"mpidp.Comm({self.comm!r}, algorithm={self.algorithm!r})"


# ---------------------------------------------------------------- duplicates

def duplicate(comm, with_model: bool = True):
    """A duplicate of the MPI communicator `comm` is (or that an `mpidp.Comm` wraps), or None.

    The duplicate is a matching space of its own, with its own tag sequence; with
    `with_model` it inherits comm's cost model (calibrated now if comm has none:
    once, not once per duplicate). Other comm-like objects (a `CountingComm`, a
    proxy) get None: use them as given.
    """
    parent = comm.comm if isinstance(comm, Comm) else comm
    if not isinstance(parent, MPI.Intracomm):
        return None
    dup = parent.Dup()
    if with_model and parent.Get_size() > 1:
        cost.model(parent)
        state(dup).inherit(state(parent))
    return dup
