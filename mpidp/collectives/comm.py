"""Comm: an mpi4py-compatible communicator whose buffer collectives run mpidp's algorithms.

Change one line of an mpi4py program::

    comm = MPI.COMM_WORLD                   # before
    comm = mpidp.Comm(MPI.COMM_WORLD)       # after

and its ``Allreduce``, ``Reduce_scatter_block``, ``Reduce_scatter``, ``Allgather``,
``Allgatherv`` and ``Bcast`` (and their ``I``-forms) run mpidp's point-to-point
algorithms, never the MPI library's collectives. Every other attribute is the
wrapped communicator's (``Get_rank``, ``Send``, ``Barrier``, ``comm.rank``, ...).

A call goes through three steps:

    buffer spec  --parse-->  typed 1-D view of the user's memory  --api.plan_*-->  rounds
    [x, 3, MPI.INT]          x[:3] as int32, no copy                 run(), or a Request

1. Parse the buffer spec (`bufspec`) with mpi4py's rules (``message_simple`` and
   ``message_vector`` in mpi4py's msgbuffer.pxi): ``buf``, ``[buf, type]``,
   ``[buf, count, type]``, ``[buf, (count, displ), type]``,
   ``[buf, count, displ, type]``; for ``Allgatherv`` counts and displs are lists.
   A count given for ``Allgather``'s recvbuf (or ``Reduce_scatter_block``'s
   sendbuf) is per rank, as in MPI. The view shares memory with ``buf``, so the
   result lands in the user's buffer.
2. Check counts and types as mpi4py does (``ValueError`` before any message).
3. Take the next tag of this Comm (see below) and hand the views to ``api.plan_*``.

Tags: collective k on this Comm uses tag ``TAG_BASE + k % TAG_SPAN``. Every rank
calls collectives in the same order, so the ranks agree on the tag, and up to
TAG_SPAN nonblocking collectives may be in flight on one Comm without their
messages crossing. Keep your own point-to-point tags below ``TAG_BASE``.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence

import numpy as np
from mpi4py import MPI

from . import api
from .api import IN_PLACE, TAG_BASE, TAG_SPAN
from .buffers import ScratchPool
from .bufspec import check_match, in_place, simple, vector
from .schedule import waitall


class RequestError(MPI.Exception):
    """What `Request.Cancel` and `Request.Free` raise: an ``MPI.Exception``
    (``MPI.ERR_REQUEST``), the type MPICH and Open MPI raise there, saying why."""

    def __init__(self, message: str):
        super().__init__(MPI.ERR_REQUEST)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"RequestError({self.message!r})"


class Request:
    """A nonblocking mpidp collective, with the methods of an mpi4py ``MPI.Request``.

    ``MPI.Request.Waitall`` and the other functions of mpi4py itself do not accept
    it (they need a real MPI request); use `Request.Waitall`, `Request.Testall`,
    `Request.Waitany`, ... or `mpidp.waitall`, which take mpi4py's requests too. The
    lower-case ``test()``/``wait()`` are `Handle`'s, so `mpidp.waitall` and
    `mpidp.testall` take these requests too.

    As an MPI request becomes ``MPI.REQUEST_NULL`` once a call has reported it
    complete, this one then becomes inactive: false as a bool, ``Wait()`` and
    ``Test()`` return True at once, and ``Waitany`` and the like skip it.
    """

    __slots__ = ("handle", "_active")

    def __init__(self, handle):
        self.handle = handle  # the Handle driving the collective (`.rounds`, `.done`)
        self._active = True  # not yet reported complete (MPI: not yet REQUEST_NULL)

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Make progress without blocking; True when the collective is complete."""
        if self.handle.test():
            self._active = False
            return True
        return False

    def Wait(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Block until the collective is complete; returns True, as mpi4py's does."""
        self.handle.wait()
        self._active = False
        return True

    def Get_status(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """True if the collective is complete (it makes progress, like MPI's);
        the request stays active, as MPI's does."""
        return self.handle.test()

    def Cancel(self) -> None:  # noqa: N802
        """Refused: MPI does not allow cancelling a collective (MPICH and Open MPI raise too)."""
        raise RequestError("an mpidp collective cannot be cancelled (nor can an MPI "
                           "collective); complete it with Wait() or Test()")

    def Free(self) -> None:  # noqa: N802
        """Release a completed request; refused while the collective is in flight.

        An mpidp collective advances only when its request is tested: freed, it would
        never finish, and the other ranks would wait for it forever. Like MPI, this
        refuses a request already released (by Free, Wait or a Test that returned True).
        """
        if not self._active:
            raise RequestError("this mpidp request was already completed and released "
                               "(an MPI request would be MPI.REQUEST_NULL)")
        if not self.handle.test():
            raise RequestError("an mpidp collective in flight cannot be freed: it advances "
                               "only when tested; Wait() for it, then free it")
        self._active = False

    def __bool__(self) -> bool:
        return self._active

    def test(self) -> bool:
        return self.handle.test()

    def wait(self) -> None:
        self.handle.wait()

    @staticmethod
    def Waitall(requests: Sequence, statuses=None) -> bool:  # noqa: N802
        """Complete every request: mpidp's, mpi4py's own, or a mix of the two.

        mpidp requests alone are completed by `mpidp.waitall` (blocking on the
        first pending one). With MPI requests in the list, every request is polled
        until all are done: blocking on an MPI request could starve an mpidp
        collective that a peer needs to finish first.
        """
        if not any(isinstance(r, MPI.Request) for r in requests):
            waitall(requests)
            return True
        while not Request.Testall(requests):
            os.sched_yield()  # oversubscribed ranks: let the peer we wait for run
        return True

    @staticmethod
    def Testall(requests: Sequence, statuses=None) -> bool:  # noqa: N802
        """Advance every request once; True if all are complete."""
        return all([r.Test() for r in requests])

    @staticmethod
    def Waitany(requests: Sequence, status: MPI.Status | None = None) -> int:  # noqa: N802
        """Complete one active request of the list; return its index, or ``MPI.UNDEFINED``
        if none is active. With mpidp requests in it, the list is polled (see Waitall)."""
        if not any(isinstance(r, Request) for r in requests):
            return MPI.Request.Waitany(requests, status)
        while True:
            index, flag = Request.Testany(requests, status)
            if flag:
                return index
            os.sched_yield()

    @staticmethod
    def Testany(requests: Sequence, status: MPI.Status | None = None) -> tuple[int, bool]:  # noqa: N802
        """Advance the active requests in order until one completes: ``(index, True)``;
        ``(MPI.UNDEFINED, True)`` if none is active, ``(MPI.UNDEFINED, False)`` if none is done."""
        if not any(isinstance(r, Request) for r in requests):
            return MPI.Request.Testany(requests, status)
        active = [i for i, r in enumerate(requests) if r]  # REQUEST_NULL and reported: False
        for i in active:
            if requests[i].Test(status):
                return i, True
        return MPI.UNDEFINED, not active

    @staticmethod
    def Waitsome(requests: Sequence, statuses=None) -> list[int] | None:  # noqa: N802
        """Complete at least one active request; the indices of those completed (None if
        none is active)."""
        if not any(isinstance(r, Request) for r in requests):
            return MPI.Request.Waitsome(requests, statuses)
        while True:
            done = Request.Testsome(requests)
            if done is None or done:
                return done
            os.sched_yield()

    @staticmethod
    def Testsome(requests: Sequence, statuses=None) -> list[int] | None:  # noqa: N802
        """Advance every active request once; the indices of those completed (None if none
        is active)."""
        if not any(isinstance(r, Request) for r in requests):
            return MPI.Request.Testsome(requests, statuses)
        active = [i for i, r in enumerate(requests) if r]
        return [i for i in active if requests[i].Test()] if active else None

    def __repr__(self) -> str:
        return f"<mpidp.Request {'done' if self.handle.done else 'pending'}>"


class Comm:
    """An mpi4py-compatible intracommunicator whose buffer collectives are mpidp's.

    Args:
        comm: an mpi4py intracommunicator, or any object with its point-to-point
            methods (such as `CountingComm`).
        algorithm: a name from `mpidp.ALGORITHMS`, used by every collective that
            has it (the others use "auto"), or a dict ``{collective: name}``.
        debug: before each collective, check that all ranks passed the same
            count, dtype, op and algorithm (one small all-gather; see api.py).
    """

    def __init__(self, comm, algorithm: str | Mapping[str, str] = "auto", *,
                 debug: bool = False):
        if isinstance(comm, Comm):
            comm = comm.comm
        if isinstance(comm, MPI.Comm):
            if comm == MPI.COMM_NULL:
                raise ValueError("cannot wrap MPI.COMM_NULL")
            if comm.Is_inter():
                raise NotImplementedError("mpidp.Comm wraps intracommunicators only")
        _check_algorithm(algorithm)
        self.comm = comm
        self.algorithm = dict(algorithm) if isinstance(algorithm, Mapping) else algorithm
        self.debug = debug
        self.pool = ScratchPool()  # scratch for this Comm's reductions
        self._calls = 0  # collectives started: the tag counter

    # ------------------------------------------------------------ reductions

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm=None) -> None:  # noqa: N802
        """Every rank's recvbuf gets the reduction of all ranks' sendbuf (MPI_Allreduce)."""
        self._allreduce(sendbuf, recvbuf, op, algorithm).run()

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm=None) -> Request:  # noqa: N802
        """Start an Allreduce; returns a Request."""
        return Request(self._allreduce(sendbuf, recvbuf, op, algorithm).start())

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *,  # noqa: N802
                             algorithm=None) -> None:
        """Rank r's recvbuf gets block r of the reduced sendbuf, equal blocks."""
        self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm).run()

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *,  # noqa: N802
                              algorithm=None) -> Request:
        """Start a Reduce_scatter_block; returns a Request."""
        return Request(self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm).start())

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *,  # noqa: N802
                       algorithm=None) -> None:
        """Rank r's recvbuf gets recvcounts[r] items of the reduced sendbuf."""
        self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, algorithm).run()

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *,  # noqa: N802
                        algorithm=None) -> Request:
        """Start a Reduce_scatter; returns a Request (recvcounts=None gathers them first)."""
        return Request(self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, algorithm).start())

    # ------------------------------------------------------------ data movement

    def Allgather(self, sendbuf, recvbuf, *, algorithm=None) -> None:  # noqa: N802
        """Block r of every rank's recvbuf gets rank r's sendbuf (MPI_Allgather)."""
        self._allgather(sendbuf, recvbuf, algorithm).run()

    def Iallgather(self, sendbuf, recvbuf, *, algorithm=None) -> Request:  # noqa: N802
        """Start an Allgather; returns a Request."""
        return Request(self._allgather(sendbuf, recvbuf, algorithm).start())

    def Allgatherv(self, sendbuf, recvbuf, *, algorithm=None) -> None:  # noqa: N802
        """Allgather with per-rank counts and displacements in the recvbuf spec."""
        self._allgatherv(sendbuf, recvbuf, algorithm).run()

    def Iallgatherv(self, sendbuf, recvbuf, *, algorithm=None) -> Request:  # noqa: N802
        """Start an Allgatherv; returns a Request."""
        return Request(self._allgatherv(sendbuf, recvbuf, algorithm).start())

    def Bcast(self, buf, root: int = 0, *, algorithm=None) -> None:  # noqa: N802
        """Every rank's buf gets root's buf (MPI_Bcast)."""
        self._bcast(buf, root, algorithm).run()

    def Ibcast(self, buf, root: int = 0, *, algorithm=None) -> Request:  # noqa: N802
        """Start a Bcast; returns a Request."""
        return Request(self._bcast(buf, root, algorithm).start())

    # ------------------------------------------------------------ parse, check, plan

    def _allreduce(self, sendbuf, recvbuf, op, algorithm):
        recv, count = simple(recvbuf, "recvbuf", writable=True)
        send = IN_PLACE
        if not in_place(sendbuf):
            send, scount = simple(sendbuf, "sendbuf")
            check_match(send, scount, recv, count)
        return self._plan(api.plan_allreduce, "allreduce", algorithm, send, recv, op=op,
                          pool=self.pool)

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, algorithm):
        n = self.comm.Get_size()
        if in_place(sendbuf):  # the n blocks are in recvbuf; a count given is per block
            recv, _ = simple(recvbuf, "recvbuf", blocks=n, writable=True)
            send = IN_PLACE
        else:
            recv, count = simple(recvbuf, "recvbuf", writable=True)
            send, scount = simple(sendbuf, "sendbuf", blocks=n)
            check_match(send, scount, recv, count)
        return self._plan(api.plan_reduce_scatter, "reduce_scatter", algorithm, send, recv,
                          op=op, pool=self.pool)

    def _reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, algorithm):
        n, rank = self.comm.Get_size(), self.comm.Get_rank()
        recv, count = simple(recvbuf, "recvbuf", writable=True)
        if in_place(sendbuf):
            if recvcounts is None:
                raise TypeError("Reduce_scatter with sendbuf=IN_PLACE needs recvcounts")
            send, total = IN_PLACE, count
        else:
            send, total = simple(sendbuf, "sendbuf")
            if send.dtype != recv.dtype:
                raise ValueError(f"mismatch in send and receive datatypes: "
                                 f"{send.dtype} and {recv.dtype}")
            if recvcounts is None:  # as mpi4py: every rank's recvbuf count, gathered
                recvcounts = self._gather_counts(count)
        recvcounts = [operator.index(c) for c in recvcounts]
        if len(recvcounts) != n:
            raise ValueError(f"expecting {n} recvcounts, got {len(recvcounts)}")
        if total != sum(recvcounts):
            raise ValueError(f"mismatch in {'receive' if send is IN_PLACE else 'send'} "
                             f"count {total} and sum(recvcounts) {sum(recvcounts)}")
        if send is not IN_PLACE and count != recvcounts[rank]:
            raise ValueError(f"mismatch in receive count {count} and "
                             f"recvcounts[{rank}] {recvcounts[rank]}")
        return self._plan(api.plan_reduce_scatter, "reduce_scatter", algorithm, send, recv,
                          recvcounts=recvcounts, op=op, pool=self.pool)

    def _allgather(self, sendbuf, recvbuf, algorithm):
        recv, count = simple(recvbuf, "recvbuf", blocks=self.comm.Get_size(), writable=True)
        send = IN_PLACE
        if not in_place(sendbuf):
            send, scount = simple(sendbuf, "sendbuf")
            check_match(send, scount, recv, count)
        return self._plan(api.plan_allgather, "allgather", algorithm, send, recv)

    def _allgatherv(self, sendbuf, recvbuf, algorithm):
        recv, counts, displs = vector(recvbuf, "recvbuf", self.comm.Get_size())
        send = IN_PLACE
        if not in_place(sendbuf):
            send, scount = simple(sendbuf, "sendbuf")
            rank = self.comm.Get_rank()
            check_match(send, scount, recv, counts[rank], f"recvcounts[{rank}]")
        return self._plan(api.plan_allgather, "allgather", algorithm, send, recv,
                          recvcounts=counts, displs=displs)

    def _bcast(self, buf, root, algorithm):
        is_root = self.comm.Get_rank() == root
        data, _ = simple(buf, "buf", writable=not is_root)
        return self._plan(api.plan_bcast, "bcast", algorithm, data, root=operator.index(root))

    def _gather_counts(self, count: int) -> list[int]:
        """Every rank's `count`, by an mpidp all-gather (Reduce_scatter without recvcounts)."""
        counts = np.zeros(self.comm.Get_size(), dtype=np.int64)
        counts[self.comm.Get_rank()] = count
        self._plan(api.plan_allgather, "allgather", None, IN_PLACE, counts).run()
        return counts.tolist()

    def _plan(self, plan, collective: str, algorithm, *args, **kwargs):
        """Call ``api.plan_<collective>`` with this Comm's algorithm, next tag and debug flag."""
        tag = TAG_BASE + self._calls % TAG_SPAN
        self._calls += 1
        try:
            return plan(self.comm, *args, algorithm=self._algorithm_for(collective, algorithm),
                        tag=tag, debug=self.debug, **kwargs)
        except BaseException:
            self._calls -= 1  # nothing was started: the tag is still free
            raise

    def _algorithm_for(self, collective: str, override) -> str:
        """The algorithm name for one call: a per-call override, else this Comm's setting."""
        if override is not None:
            return override  # api checks it against ALGORITHMS[collective]
        if isinstance(self.algorithm, Mapping):
            return self.algorithm.get(collective, "auto")
        names = api.ALGORITHMS.get(collective, ("auto",))
        return self.algorithm if self.algorithm in names else "auto"

    # ------------------------------------------------------------ new communicators

    def _wrap(self, newcomm):
        """A communicator made from this one, wrapped with the same settings."""
        if newcomm == MPI.COMM_NULL or (isinstance(newcomm, MPI.Comm) and newcomm.Is_inter()):
            return newcomm
        return Comm(newcomm, self.algorithm, debug=self.debug)

    def Dup(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Dup(*args, **kwargs))

    def Dup_with_info(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Dup_with_info(*args, **kwargs))

    def Idup(self, *args, **kwargs) -> tuple:  # noqa: N802
        newcomm, request = self.comm.Idup(*args, **kwargs)
        return self._wrap(newcomm), request

    def Clone(self) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Clone())

    def Split(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Split(*args, **kwargs))

    def Split_type(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Split_type(*args, **kwargs))

    def Create(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Create(*args, **kwargs))

    def Create_group(self, *args, **kwargs) -> Comm:  # noqa: N802
        return self._wrap(self.comm.Create_group(*args, **kwargs))

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


# ---------------------------------------------------------------- algorithm names

def _check_algorithm(algorithm) -> None:
    """Raise ValueError for a name (or dict entry) that mpidp.ALGORITHMS does not list."""
    algorithms = api.ALGORITHMS
    if isinstance(algorithm, str):
        names = sorted({name for names in algorithms.values() for name in names})
        if algorithm not in names:
            raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {names}, "
                             f"or a dict {{collective: name}} (see mpidp.ALGORITHMS)")
    elif isinstance(algorithm, Mapping):
        for collective, name in algorithm.items():
            if collective not in algorithms:
                raise ValueError(f"unknown collective {collective!r}; "
                                 f"expected one of {list(algorithms)}")
            if name not in algorithms[collective]:
                raise ValueError(f"unknown {collective} algorithm {name!r}; "
                                 f"expected one of {algorithms[collective]}")
    else:
        raise TypeError(f"algorithm must be a name or a dict, not {type(algorithm).__name__}")
