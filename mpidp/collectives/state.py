"""What mpidp keeps per communicator: the tag sequence, scratch, the cost model and its choices.

MPI matches collectives by the order in which each rank calls them. mpidp's
collectives are point-to-point messages, which match by (source, tag), so the
order becomes a tag: the k-th collective started on a communicator takes the
k-th number of that communicator's sequence, on every rank alike, and any number
of them may be in flight together without their messages crossing. Every entry
point (the functions, `mpidp.Comm`, the I-forms, `DataParallel`'s buckets, the
cost model's calibration) takes its number here, and takes it first: a call that
then raises has used it up on that rank as on the others.

A tag packs the slot of that number and a signature of the call (`signature`):

    tag = TAG_BASE + sig·slots + k mod slots        sig in 1 .. sigs/2 - 1 (0: no signature)

Ranks that disagree on the count, dtype, op, root or algorithm compute different
signatures, so their messages cannot match and no data is exchanged: the
collective stalls (a deadline ends it) instead of returning garbage. A
mismatch slips through only when two signatures collide, with odds 1/(sigs/2 - 1).
The upper half of the signatures is for persistent collectives, which keep their
number and tag for life (``*_init``), so that a collective started later with the
same slot never meets them. Tags below TAG_BASE are the user's own.

How many tags there are is the MPI library's tag bound (``MPI.TAG_UB``). Where it
is wide (MPICH: 2**29 - 1, Open MPI: 2**31 - 1) a communicator has SLOTS = 4096
slots and 65536 signatures: odds of 1 in 32767. The smallest bound the MPI
standard allows, 32767, leaves 12976 tags: the slots are halved until there are
MIN_SIGS signatures (512 slots, 25 signatures: odds of 1 in 11, and 13 for the
persistent ones). The bound is an attribute of the world communicator, valid for
every communicator of the job; Open MPI gives it on COMM_WORLD and its duplicates
only (not on COMM_SELF, nor on a Split one), so it is read there.

The state lives where the communicator does: as an attribute of the MPI
communicator (two wrappers of one communicator share it; a duplicate is a new
communicator and starts its own, inheriting the cost model only when asked,
`inherit`), or, for a comm-like object that wraps none, beside the object.
"""

from __future__ import annotations

import operator
import threading
import weakref
import zlib

from mpi4py import MPI

from .. import flight
from .bounded import Bounded
from .engine.staging import ScratchPool

TAG_BASE = 0x4D50  # 19792: mpidp's tags are TAG_BASE and up; below it, the user's
SLOTS = 4096  # collectives in flight at once on one communicator, where the tag bound allows
MAX_SIGS = 1 << 16
MIN_SIGS = 16  # under a narrow tag bound, fewer slots rather than fewer signatures than this
STANDARD_TAG_UB = 32767  # the smallest tag bound the MPI standard allows
SCHEDULES = 1024  # blocking calls' schedules kept per communicator (each holds <= 16 KiB)


class CommState:
    """One communicator's tag sequence, scratch pool, cost model and remembered choices."""

    def __init__(self, tag_ub: int = STANDARD_TAG_UB):
        self.pool = ScratchPool()  # scratch of this communicator's collectives
        self.model = None  # the calibrated cost.Model, set by cost.model / set_model
        self.measured = False  # `model` was calibrated (not given): `addrate` may time too
        self.choices = Bounded()  # (collective, nbytes) -> algorithm name, under `model`
        self.placement = None  # the host of each rank, once learned (placement.placement)
        self.setups = Bounded()  # call signature -> what it determines (`plan.Call.setup`)
        self.schedules = Bounded(limit=SCHEDULES)  # blocking calls' schedules (`blocking`)
        self.flight = None  # the last collectives (`mpidp.flight`), set where it is found
        room = tag_ub - TAG_BASE + 1  # tags from TAG_BASE to tag_ub
        self.slots = SLOTS
        while room // self.slots < MIN_SIGS and self.slots > 1:
            self.slots //= 2
        self.sigs = min(MAX_SIGS, room // self.slots)
        if self.sigs < 2:
            raise RuntimeError(f"the MPI tag bound {tag_ub} leaves no room for mpidp's tags")
        # signatures 1 .. half-1 for collectives started once, half .. sigs-1 for persistent
        # ones, which keep their tag for life (none where the tag bound is the minimum)
        self.half = self.sigs // 2 if self.sigs >= 4 else self.sigs
        self.started = 0  # collectives started: the sequence
        self._busy: set[int] = set()  # slots of collectives in flight on this rank
        self.requests: dict[int, object] = {}  # slot -> its Request while in flight (Free)
        self._held: set[int] = set()  # slots of this rank's persistent collectives
        self._lock = threading.Lock()  # a progress thread may start or end collectives too
        # MPIDP_DEBUG: the thread starting a collective here now (`begin_start`), and how
        # deep (a start that starts another on the same thread, as Reduce_scatter's counts)
        self._starting = threading.Lock()
        self._starter: threading.Thread | None = None
        self._depth = 0

    def take(self) -> int:
        """The next slot of the sequence, marked in flight until `release`.

        Raises RuntimeError if the collective that had this slot `slots` numbers ago
        is still in flight here: its messages and the new one's would cross.
        """
        lock = self._lock
        lock.acquire()  # (not `with`: 0.05 µs against 0.13, on every call's path)
        try:
            slot = self.started % self.slots
            self.started += 1
            if slot in self._busy:
                raise RuntimeError(
                    f"{self.slots} collectives are in flight on this communicator: the tag "
                    f"of collective {self.started - 1} is still used by collective "
                    f"{self.started - 1 - self.slots}; complete (wait on) earlier ones first")
            self._busy.add(slot)
        finally:
            lock.release()
        return slot

    def release(self, slot: int) -> None:
        """The collective that took `slot` is complete (or never started)."""
        self._busy.discard(slot)

    def hold(self, slot: int) -> None:
        """Keep `slot` for a persistent collective (its tags are in their own range)."""
        with self._lock:
            if self.half == self.sigs:
                raise RuntimeError("the MPI tag bound leaves no room for persistent collectives")
            if slot in self._held:
                raise RuntimeError(f"a persistent collective created {self.slots} collectives ago "
                                   "still holds this tag; free (Free()) earlier ones first")
            self._busy.discard(slot)
            self._held.add(slot)

    def unhold(self, slot: int) -> None:
        self._held.discard(slot)

    def begin_start(self) -> None:
        """(``MPIDP_DEBUG``) This thread starts a collective here; RuntimeError if another
        thread is starting one at the same time.

        MPI makes that program erroneous: the two threads' calls may take their numbers
        in one order here and in another on a peer, and then collectives exchange each
        other's data. A start lasts from taking the slot until the call returns (a
        blocking collective: complete; an I-form: its first round posted; ``*_init``:
        planned). A non-blocking acquire: the check never waits, and costs nothing
        with the check off. Threads that only test or wait (a progress thread) start
        nothing.
        """
        me = threading.current_thread()
        if self._starter is me:  # (only this thread ever sets it to itself)
            self._depth += 1
            return
        if not self._starting.acquire(blocking=False):
            other = self._starter
            raise RuntimeError(
                f"two threads start collectives on one communicator at once: thread "
                f"{me.name!r} started one while thread "
                f"{'?' if other is None else repr(other.name)} is starting another. MPI "
                "makes this erroneous (the ranks may order the two calls differently, and "
                "exchange each other's data): start a communicator's collectives from one "
                "thread at a time, or give each thread a communicator of its own (Dup())")
        self._starter, self._depth = me, 1

    def end_start(self) -> None:
        """The start that `begin_start` opened on this thread is over."""
        self._depth -= 1
        if self._depth == 0:
            self._starter = None
            self._starting.release()

    def tag(self, slot: int, sig: int = 0, persistent: bool = False) -> int:
        """The tag for `slot`, with a call signature folded in (0: none)."""
        if persistent:
            index = self.half + sig % (self.sigs - self.half)
        else:
            index = 1 + sig % (self.half - 1) if sig else 0
        return TAG_BASE + index * self.slots + slot

    def inherit(self, parent: CommState) -> None:
        """Take over `parent`'s cost model and placement (a duplicate of the same ranks: no
        new calibration, no new query)."""
        self.forget(parent.model)
        self.choices, self.placement = Bounded(parent.choices), parent.placement
        self.measured = parent.measured

    def forget(self, model) -> None:
        """Use cost model `model` from now on: what `auto` chose under the old one, and the
        setups and recorded schedules made of its choices, are stale."""
        self.model, self.choices, self.measured = model, Bounded(), False
        self.setups, self.schedules = Bounded(), Bounded(limit=SCHEDULES)


def signature(*args) -> int:
    """A non-zero number that every rank computes alike from the same arguments.

    `args` are hashable values with a stable ``repr`` (ints, tuples, dtypes, names,
    `Op`s); the result is remembered, so a repeated call costs one dict lookup.
    """
    sig = _signatures.get(args)
    if sig is None:
        sig = _signatures.remember(args, zlib.crc32(repr(args).encode()) or 1)
    return sig


_signatures = Bounded()  # args -> their signature


def check_user_tag(tag) -> int:
    """An explicit tag must be the user's (below TAG_BASE): mpidp's sequence owns the rest.

    Any integer (``np.int64(5)``) is taken as the int it is (`operator.index`)."""
    try:
        value = None if isinstance(tag, bool) else operator.index(tag)
    except TypeError:
        value = None
    if value is None or not 0 <= value < TAG_BASE:
        raise ValueError(f"tag={tag!r}: an explicit tag must be an int in 0..{TAG_BASE - 1}; "
                         f"tags from {TAG_BASE} up are mpidp's own sequence (leave tag unset)")
    return value


INTERCOMM = ("mpidp's collectives run on intracommunicators only, and this is an "
             "intercommunicator (MPI's collectives there combine the other group's data, "
             "which mpidp's algorithms do not): make one intracommunicator of both groups "
             "(comm.Merge()), or call the MPI library's own collective")


# ------------------------------------------------------------ finding a comm's state

_keyval = None
_by_object: dict[int, tuple] = {}  # id(comm object) -> (weak reference, its state)
_unwrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # states of comm-likes


def state(comm) -> CommState:
    """The state of `comm`'s underlying communicator (created on first use).

    The answer is remembered per comm object (held by a weak reference, so an id
    reused by a new object is never taken for the old one): an MPI attribute
    lookup costs more than a small collective's own checks.
    """
    entry = _by_object.get(id(comm))
    if entry is not None and entry[0]() is comm:
        return entry[1]
    found = _find(comm)
    key = id(comm)
    try:
        # (the table bound now: at exit the module's globals may be gone before the comm)
        _by_object[key] = (weakref.ref(comm, lambda _, key=key, table=_by_object:
                                       table.pop(key, None)), found)
    except TypeError:  # an object without weak references: look it up every time
        pass
    return found


def _find(comm) -> CommState:
    base = comm
    while not isinstance(base, MPI.Comm) and hasattr(base, "comm"):  # mpidp.Comm, CountingComm
        base = base.comm
    if not isinstance(base, MPI.Comm):  # a comm-like object that wraps none
        found = _unwrapped.get(base)
        if found is None:
            found = _unwrapped[base] = CommState(_tag_ub(base))
            found.flight = flight.recorder(base)
        return found
    if base.Is_inter():  # never given a state, so every call on it gets here and raises
        raise NotImplementedError(INTERCOMM)
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval()  # not copied by Dup: a duplicate starts afresh
    found = base.Get_attr(_keyval)
    if found is None:
        found = CommState(_tag_ub(base))
        found.flight = flight.recorder(base)
        base.Set_attr(_keyval, found)
    return found


def _tag_ub(comm) -> int:
    """`comm`'s tag bound: its own attribute, else the world's (MPI defines it there, for
    every communicator of the job), else the standard's minimum (a comm-like object)."""
    for where in (comm, MPI.COMM_WORLD) if isinstance(comm, MPI.Comm) else (comm,):
        try:
            ub = where.Get_attr(MPI.TAG_UB)
        except Exception:  # noqa: BLE001 - a comm-like object without attributes
            ub = None
        if ub is not None:
            return int(ub)
    return STANDARD_TAG_UB
