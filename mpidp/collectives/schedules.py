"""Schedules: a planned blocking call's rounds and reductions, noted once for `blocking`.

After a blocking call has been planned and run (`api`, `mpidp.Comm`), `record` runs its
algorithm's generator again, dry: on stand-ins for the caller's buffers, its reductions
done on zeros (`engine.replay.Recorder` logs them), nothing sent. Every array a round or
a reduction names is noted as an operand of a call (`_Places`):

    operands of a call  [buf, src, parts of them ..., the record's own values, reversed]
    noted as            0    1    2, 3, ...            -1, -2, ... (its scratch, AVG's N)

so that a replay binds a record to the caller's arrays with one list (`blocking`). Which
calls are recorded, and which are noted as never to be (`PLANNED`), is `blocking`'s
docstring's list of conditions; each collective's part of it is its ``_record_*``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..config import debug_enabled
from .algorithms.ops import AVG
from .algorithms.rounds import Send
from .engine.completion import default_timeout
from .engine.replay import Recorder
from .mpiops import resolve_op
from .placement import locate
from .plan import Signed
from .plans import IN_PLACE
from .state import state

REDUCE_BYTES = 16384  # an all-reduce's record keeps its scratch: recorded up to this size
PLANNED = "planned"  # a signature noted not to be replayed
_ndarray = np.ndarray


class Schedule(NamedTuple):
    """One signature's recorded run, its arrays as indices into a call's operands."""

    pre: list  # reductions before the first round: (ufunc, a, b, out)
    steps: list  # per round (`_Places.step`): how to exchange it, the reductions after it
    parts: tuple  # (which, start, stop): operands 2, 3, ... are these parts of buf or src
    values: tuple  # the record's own values (its scratch, AVG's N), last operand first
    signed: Signed  # the signature, as a planned call's flight entry holds it
    tag_base: int  # the tag of slot 0 (`state.CommState.tag`): a call's tag is this + slot


def record(collective: str, comm, *args, checks: str = "api") -> None:
    """After a planned blocking call: keep its signature's record if it is one to replay,
    or note that it is not (`PLANNED`).

    `args` are the call's: all-reduce (sendbuf, recvbuf, op, algorithm), all-gather
    (sendbuf, recvbuf, algorithm), broadcast (buf, root, algorithm); `checks`: whose
    checks of the kinds of arguments it passed, ``"api"`` or ``"mpi4py"`` (`mpidp.Comm`).
    """
    if debug_enabled() or default_timeout() is not None or not isinstance(comm, MPI.Comm):
        return  # (nothing replays there: `blocking`'s conditions)
    key = KEYS[collective](*args, checks)
    st = state(comm)
    if key is None or key in st.schedules:  # not a call to record, or recorded (or noted)
        return
    s = st.setups.get(_SETUP[collective](key))  # what the planned call set up
    if s is None:  # (a first call that calibrated auto: it set up anew, in the old setups)
        return
    made = None
    if s.algo.replayable and comm.Get_size() > 1:  # (in place only: out of place it copies)
        made = _RECORD[collective](comm, s, *args)
    if made is None or (s.algo.replayable == "in place" and made[1][1] is not None):
        st.schedules.remember(key, PLANNED)
        return
    run_args, stand_ins, recorder, after = made
    algo = s.algo.bound(locate(comm, st, collective, s.algo.name))  # (learned: the call's)
    pre, rounds = [] if recorder is None else recorder.log, []
    for count, round_ in enumerate(algo(*run_args)):
        reductions = []  # those that follow this round
        if recorder is not None:
            recorder.log = reductions
        rounds.append((count, round_, reductions))
    rounds[-1][2].extend(after)  # what the call writes itself, after the last round
    places = _Places(stand_ins)
    try:
        pre = [places.reduction(r) for r in pre]
        steps = [places.step(*r) for r in rounds]
    except _NotAPart:
        st.schedules.remember(key, PLANNED)
        return
    st.schedules.remember(key, Schedule(pre, steps, tuple(places.parts),
                                        tuple(reversed(places.values)), s.signed,
                                        st.tag(0, s.signed.sig)))


# ------------------------------------------------------------ each collective's part

def allreduce_key(sendbuf, recvbuf, op, algorithm, checks: str) -> tuple | None:
    """An all-reduce's key among the schedules; None where it is not one to record (not
    1-D NumPy arrays of one size, over `REDUCE_BYTES`, an op that is none)."""
    if type(recvbuf) is not _ndarray or recvbuf.ndim != 1 or recvbuf.nbytes > REDUCE_BYTES:
        return None
    if sendbuf is IN_PLACE:
        sent = None
    elif type(sendbuf) is _ndarray and sendbuf.ndim == 1 and sendbuf.size == recvbuf.size:
        sent = sendbuf.dtype
    else:
        return None
    try:
        name = resolve_op(op).name
    except Exception:  # noqa: BLE001 - not an op: the planned call says what is wrong
        return None
    return "allreduce", recvbuf.size, recvbuf.dtype, name, algorithm, sent, checks


def allgather_key(sendbuf, recvbuf, algorithm, checks: str) -> tuple | None:
    """An all-gather's key: equal blocks, packed (counts and displs are planned)."""
    if type(recvbuf) is not _ndarray or recvbuf.ndim != 1:
        return None
    if sendbuf is IN_PLACE:
        sent = None
    elif type(sendbuf) is _ndarray and sendbuf.ndim == 1:
        sent = sendbuf.size, sendbuf.dtype
    else:
        return None
    return "allgather", recvbuf.size, recvbuf.dtype, algorithm, sent, checks


def bcast_key(buf, root, algorithm, checks: str) -> tuple | None:
    """A broadcast's key."""
    if type(buf) is not _ndarray or buf.ndim != 1 or type(root) is not int:
        return None
    return "bcast", buf.size, buf.dtype, root, algorithm, checks


KEYS = {"allreduce": allreduce_key, "allgather": allgather_key, "bcast": bcast_key}
_SETUP = {  # a key's setup key (`plan.Call.setup`, as `plans` makes them)
    "allreduce": lambda k: k[:5],
    "allgather": lambda k: ("allgather", k[4] and k[4][0], k[1], None, None, k[2], k[3]),
    "bcast": lambda k: k[:5]}


def _record_allreduce(comm, s, sendbuf, recvbuf, op, algorithm):
    """(the generator's arguments on stand-ins, the stand-ins, the op's `Recorder`, what
    the call writes itself after the rounds), or None where the call is planned."""
    op = resolve_op(op)
    if recvbuf.size == 0 or op.exact or (op is AVG and recvbuf.dtype.kind == "f"
                                         and recvbuf.itemsize == 2):
        return None  # (the call path's own rounds: the exact passes, the float32 mean)
    buf = np.zeros_like(recvbuf)
    src = None if sendbuf is IN_PLACE else np.zeros_like(recvbuf)
    tmp = np.zeros(s.scratch, recvbuf.dtype)  # the record's own scratch, kept with it
    recorder = Recorder(op, [])  # does the reductions (on zeros) and logs them
    return (comm, buf, s.blocks, recorder, tmp, src), (buf, src), recorder, ()


def _record_allgather(comm, s, sendbuf, recvbuf, algorithm):
    if recvbuf.size == 0 or not s.blocks.packed or (sendbuf is not IN_PLACE
                                                    and not s.algo.takes_src):
        return None  # (the call path's own rounds around it: packing, a copy first)
    buf = np.zeros_like(recvbuf)
    if sendbuf is IN_PLACE:
        return (comm, buf, s.blocks), (buf, None), None, ()
    src = np.zeros_like(sendbuf)  # sent from where it is, then copied to its place
    mine = s.blocks.view(buf, comm.Get_rank())
    return (comm, buf, s.blocks, src), (buf, src), None, [(_copy, src, None, mine)]


def _record_bcast(comm, s, buf, root, algorithm):
    if buf.size == 0 or not buf.flags.writeable:  # (a read-only root's runs on a copy)
        return None
    stand_in = np.zeros_like(buf)
    return (comm, stand_in, root), (stand_in, None), None, ()


_RECORD = {"allreduce": _record_allreduce, "allgather": _record_allgather,
           "bcast": _record_bcast}


def _copy(a, _, out) -> None:
    out[...] = a


class _Places:
    """Notes each array of a dry run as an index into a call's operands (the docstring)."""

    def __init__(self, stand_ins: tuple):
        self.stand_ins, self.parts, self.values = stand_ins, [], []

    def step(self, count: int, round_: list, reductions: list) -> tuple:
        """A round as the replay runs it: (round number, its messages), which a flight
        entry holds while it is in flight (it reads their peers); then how it runs,
        (send, to, recv, source): a send and a receive as the operands and peers of one
        ``Sendrecv``, a lone send or receive as its own with Nones for the other (a
        broadcast's round: no message tuples made at each call), any other round as its
        messages [(kind, operand, peer)] and Nones; then the reductions that follow it."""
        running = (count, [type(m)(np.empty(0, np.uint8), m.peer) for m in round_])
        reductions = [self.reduction(r) for r in reductions]
        sends = [m for m in round_ if type(m) is Send]
        recvs = [m for m in round_ if type(m) is not Send]
        if round_ and len(sends) <= 1 and len(recvs) <= 1:
            def placed(ms: list) -> tuple:  # (operand, peer) of the one message, or Nones
                return (self.index(ms[0].buf), ms[0].peer) if ms else (None, None)
            return (running, *placed(sends), *placed(recvs), reductions)
        messages = [(type(m), self.index(m.buf), m.peer) for m in round_]
        return running, messages, None, None, None, reductions

    def reduction(self, logged: tuple) -> tuple:
        f, a, b, out = logged
        return f, self.index(a), self.index(b), self.index(out)

    def index(self, x) -> int:
        """0 or 1: all of buf or src; 2, 3, ...: a part of one; -1, -2, ...: a value of the
        record's own (its scratch, or a number), which the record keeps."""
        if isinstance(x, _ndarray) and x.size:
            at = x.__array_interface__["data"][0]
            for which, base in enumerate(self.stand_ins):
                start = None if base is None else base.__array_interface__["data"][0]
                if start is not None and start <= at < start + base.nbytes:
                    if not x.flags.c_contiguous or x.dtype != base.dtype:
                        raise _NotAPart(x)  # (no algorithm names such a view: planned)
                    first = (at - start) // base.itemsize
                    if first == 0 and x.size == base.size:
                        return which
                    return 2 + _found(self.parts, (which, first, first + x.size))
        return -1 - _found(self.values, x)


class _NotAPart(ValueError):
    """A view of a caller's buffer that is not a run of its items (strided, retyped)."""


def _found(kept: list, x) -> int:
    """Where `x` is in `kept` (the same object, or an equal part), appended if nowhere."""
    for i, y in enumerate(kept):
        if y is x or (type(x) is tuple and y == x):
            return i
    kept.append(x)
    return len(kept) - 1
