"""Communicator ids for the flight records: one id on every member, another for every other
communicator, so that `mpidp.doctor` lines the ranks' records up right.

- ``world`` and ``self``; a duplicate (``Dup``, ``Idup``, ``Dup_with_info``) is its
  parent's id and its place among the parent's duplicates, ``world.0``, ``world.1``,
  ``world.0.0``: an MPI attribute copy callback numbers them, on every member alike,
  since a duplication is collective over the parent.
- a communicator made otherwise (``Split``, ``Create``: MPI copies no attribute
  there) is named at its first collective, by its members (a crc of their world
  ranks) and a number: each member's count of the communicators with these members
  it used before. Members that use two such communicators in opposite orders (a
  deadlock) count them differently, so the numbers are exchanged (an ``Isend`` of
  one integer to every other member, at the first use only, on the largest tag MPI
  allows, above every tag of mpidp's collectives) and the id is all of them:
  ``g<crc>#0`` where every member counted 0, ``g<crc>#0-1-0`` where they differ.
  Until every number has arrived the id holds ``?`` for the missing ones, and the
  record holds the numbers known (``parts``): a member that never used the
  communicator never sends its number, and `mpidp.doctor.records` lines up the
  records whose known numbers agree.
"""

from __future__ import annotations

import collections
import threading
import weakref
import zlib

import numpy as np
from mpi4py import MPI


class Ident:
    """The attribute that names a communicator; its duplicates are named from it."""

    def __init__(self, name: str | None = None, parent: Ident | None = None, index: int = 0,
                 agreement: Agreement | None = None):
        self._name, self.parent, self.index = name, parent, index
        self.agreement, self.children = agreement, 0

    @property
    def name(self) -> str:
        if self.parent is not None:  # read now: the parent's may still be being agreed on
            return f"{self.parent.name}.{self.index}"
        if self.agreement is not None:
            return self.agreement.name()
        return self._name


def _copy(comm, keyval, parent: Ident) -> Ident:  # MPI calls it in Dup, on every member
    child = Ident(parent=parent, index=parent.children)
    parent.children += 1
    return child


def name_of(key: str, parts: list) -> str:
    """``g<crc>#k`` where every member counted k, else each member's number (``?``: not
    known yet)."""
    if None not in parts and len(set(parts)) == 1:
        return f"{key}#{parts[0]}"
    return f"{key}#" + "-".join("?" if p is None else str(p) for p in parts)


class Agreement:
    """This rank's number for a communicator named at first use, sent to every other
    member, and theirs as they arrive (`progress` never blocks)."""

    def __init__(self, comm, key: str, mine: int, tag: int):
        n, me = comm.Get_size(), comm.Get_rank()
        self.key, self.parts = key, [None] * n
        self.parts[me] = mine
        self._mine = np.array([mine], np.int64)
        self._bufs = {r: np.empty(1, np.int64) for r in range(n) if r != me}
        self._comm, self._tag = weakref.ref(comm), tag  # (its state dies with it)
        self._sends: list = []
        self._recvs: dict | None = None  # posted by `post`
        self._lock = threading.Lock()  # the main thread's calls and a dump's
        self.done = not self._bufs
        _open.add(self)

    def post(self) -> None:
        """Send this rank's number and post the receives of the others': at the first
        collective that starts (past its checks: a call refused on one rank sends nothing,
        and every member of a collective that starts takes the numbers in at its own)."""
        with self._lock:
            comm, tag = self._comm(), self._tag
            if self._recvs is None and comm is None:  # the object is gone: nothing to send on
                self._recvs, self.done = {}, True
            elif self._recvs is None:
                self._sends = [comm.Isend(self._mine, r, tag) for r in self._bufs]
                self._recvs = {r: comm.Irecv(buf, r, tag) for r, buf in self._bufs.items()}

    def progress(self) -> bool:
        """Take in the numbers that have arrived; True once all have and every send is done."""
        if self.done or self._recvs is None or not self._lock.acquire(blocking=False):
            return self.done
        try:
            for r, req in list(self._recvs.items()):
                if req.Test():
                    self.parts[r] = int(self._bufs[r][0])
                    del self._recvs[r]
            self._sends = [s for s in self._sends if not s.Test()]
            self.done = not self._recvs and not self._sends
        finally:
            self._lock.release()
        return self.done

    def cancel(self) -> None:
        """Cancel the receives still posted (numbers that never came: a member that never
        used the communicator), so none is left at MPI_Finalize, nor on the tag for a
        program's own ANY_TAG receive to take. The sends are left to complete."""
        with self._lock:
            for req in self._recvs.values():
                try:
                    req.Cancel()
                    req.Test()  # (completes the cancelled request)
                except Exception:  # noqa: BLE001 - at exit: a request MPI already freed
                    pass
            self._recvs = {}

    def name(self) -> str:
        return name_of(self.key, self.parts)


_open: weakref.WeakSet = weakref.WeakSet()  # the agreements made: `cancel_all` ends theirs


def cancel_all() -> None:
    """`Agreement.cancel` for every agreement whose numbers have not all arrived (at exit,
    before MPI_Finalize: flight's at-exit hook)."""
    for agreement in list(_open):
        if not agreement.progress():
            agreement.cancel()


_idkey = MPI.Comm.Create_keyval(copy_fn=_copy)
MPI.COMM_WORLD.Set_attr(_idkey, Ident("world"))
MPI.COMM_SELF.Set_attr(_idkey, Ident("self"))
_first_use: collections.Counter = collections.Counter()  # members -> comms named by use
# The agreement's tag: the largest MPI allows. mpidp's collectives' tags
# (collectives/state.py) stay below it: TAG_BASE + sigs * SLOTS <= TAG_UB, equal only
# where TAG_UB - TAG_BASE + 1 is a multiple of SLOTS, which 2**k - 1 never is.
_TAG = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)


def identify(base) -> tuple[Ident, str, list[int] | None]:
    """(the communicator's Ident, how it was named: "creation" or "first use", its
    members' world ranks); the first use of a communicator MPI made without copying
    attributes sends this rank's number to its other members (`Agreement`)."""
    if not isinstance(base, MPI.Comm):
        _first_use["local"] += 1
        return Ident(f"local#{_first_use['local'] - 1}"), "first use", None
    try:
        members = list(base.Get_group().Translate_ranks(range(base.Get_size()),
                                                        MPI.COMM_WORLD.Get_group()))
    except MPI.Exception:  # an intercommunicator's remote side, a freed group
        members = None
    ident = base.Get_attr(_idkey)
    if ident is not None:
        return ident, "creation", members
    crc = zlib.crc32(repr(members).encode())
    key, mine = f"g{crc:08x}", _first_use[crc]
    _first_use[crc] += 1
    if members is None or len(members) == 1 or not _TAG:
        ident = Ident(f"{key}#{mine}")
    else:
        ident = Ident(agreement=Agreement(base, key, mine, _TAG))
    base.Set_attr(_idkey, ident)  # its duplicates are numbered from it
    return ident, "first use", members
