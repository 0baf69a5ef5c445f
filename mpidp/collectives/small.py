"""Small blocking all-reduces: a signature's schedule recorded once, then replayed.

An all-reduce of a few KiB takes longer in Python than on the wire: planning it
(a `Plan`, scratch from the pool, the algorithm's generator and its rounds) costs
more than its one or two messages (docs/benchmarks-notes.md, "Small blocking calls
replayed"). But a schedule depends only on the signature (count, dtype, op,
algorithm) and the comm: which views go to which peer in which round, and which
reductions follow. So the first small call of a signature records it, on buffers
of the comm's own, and every later one replays the record there:

    first call of a signature (planned)         every later call (`allreduce` here)
    -----------------------------------         -----------------------------------
    the call path: slot, checks, setup, tag     slot, the arrays' checks, tag
    the generator on the caller's buffers       copy the input into the own buffer
    then, locally, the generator run dry on     per recorded round: exchange(round, tag)
    the own buffers, its rounds and its         per recorded reduction: ufunc(a, b, out=)
    reductions logged (`record`)                copy the result out

A replayed call is every other call on the wire: it takes its own slot and tag of the
comm's sequence (`state`), and its messages are those the generator sends for its
signature (the same peers, sizes and tags; in place and out of place send the same
messages, the input is only read from elsewhere). So each rank replays or plans as it
likes, and the ranks need not agree on which. Where a call's own work raises (a
reduction), its slot goes back and its flight entry says why, as a planned call's.

Replayed only where every condition holds (else the call is planned, as any other):
NumPy arrays of at most `SMALL_BYTES`, a registered algorithm that writes only by
receives and its op and reads no placement (`Algorithm.replayable`, not `placed`),
a plain op (no exact sum, no float16 average), more than one rank, and neither
``MPIDP_DEBUG`` (its agreement check is the planned path's) nor ``MPIDP_TIMEOUT``
(a deadline is the `Request`'s). The records are kept per communicator
(`CommState.schedules`, at most `state.SCHEDULES`) and forgotten with its cost model, as the
algorithm ``auto`` picks may change.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from .. import flight
from ..config import debug_enabled
from .algorithms.ops import AVG
from .algorithms.rounds import Send
from .engine.completion import default_timeout
from .engine.driver import exchange
from .engine.replay import Recorder
from .mpiops import resolve_op
from .plan import Signed
from .plans import IN_PLACE
from .state import state

SMALL_BYTES = 4096  # larger: the two copies cost more than the Python a replay saves

PLANNED = "planned"  # a signature found not to be replayed (the conditions above)
_ndarray = np.ndarray
_RUNNING, _DONE = flight.RUNNING, flight.DONE


class Schedule(NamedTuple):
    """One signature's recorded run on buffers of its own."""

    buf: np.ndarray  # the vector the run reduces in place: the input in, the result out
    pre: list  # reductions before the first round, (ufunc, a, b, out)
    steps: list  # per round (`_step`): how to exchange it, then the reductions after it
    signed: Signed  # the signature, as a planned call's flight entry holds it
    tag_base: int  # the tag of slot 0 (`state.CommState.tag`): a call's tag is this + slot


def allreduce(comm, sendbuf, recvbuf, op, algorithm: str, checks: str = "api") -> bool:
    """Run a small blocking all-reduce by replaying its signature's schedule; False (and
    nothing done, no slot taken) where none is recorded or the call is not one to replay.

    `checks`: whose checks of the kinds of arguments the recorded call passed, ``"api"``
    (`mpidp.allreduce`) or ``"mpi4py"`` (`mpidp.Comm.Allreduce`, whose rules differ).
    """
    if type(recvbuf) is not _ndarray or recvbuf.ndim != 1 or recvbuf.nbytes > SMALL_BYTES:
        return False
    in_place = sendbuf is IN_PLACE
    if not in_place and type(sendbuf) is not _ndarray:
        return False
    st = state(comm)
    try:
        name = resolve_op(op).name
        found = st.schedules.get((recvbuf.size, recvbuf.dtype, name, algorithm,
                                  None if in_place else sendbuf.dtype, checks))
    except Exception:  # noqa: BLE001 - a bad op or argument: the planned path raises
        return False
    if found is None or found is PLANNED or debug_enabled() or default_timeout() is not None:
        return False
    # the kinds were checked when it was recorded; the arrays themselves now (a bad
    # one is planned, and the planned path's checks say what is wrong)
    flags = recvbuf.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    if not in_place and (sendbuf.size != recvbuf.size or not sendbuf.flags.c_contiguous
                         or np.may_share_memory(sendbuf, recvbuf)):
        return False
    slot = st.take()  # the call's number and tag, first of all (as `plan.Call`)
    tag, rec = found.tag_base + slot, st.flight
    entry = None if rec is None else rec.add(st.started - 1, found.signed, tag)
    if entry is not None and rec.agreeing is not None:
        rec.started()  # (a Split comm's id still being agreed on: its numbers go out)
    buf = found.buf
    try:
        buf[...] = recvbuf if in_place else sendbuf
        for f, a, b, out in found.pre:
            f(a, b, out)
        for running, send, to, recv, source, reductions in found.steps:
            if entry is not None:  # the round in flight, for a flight dump
                entry[_RUNNING] = running
            if send is None:
                exchange(comm, running[1], tag)
            else:  # one Sendrecv, its buffer specs made once (`driver.exchange` spells them)
                comm.Sendrecv(send, to, tag, recv, source, tag)
            for f, a, b, out in reductions:
                f(a, b, out)
        recvbuf[...] = buf
    except BaseException as e:
        st.release(slot)
        if entry is not None:
            entry[_RUNNING] = None
            flight.fail(entry, e)
        raise
    st.release(slot)
    if entry is not None:
        entry[_RUNNING] = _DONE
    return True


def record(comm, sendbuf, recvbuf, op, algorithm: str, checks: str = "api") -> None:
    """After a planned blocking all-reduce: record its signature's schedule if it is one
    to replay (the module docstring's conditions). Local: the generator runs dry, its
    rounds logged and its reductions done on zeros, nothing sent."""
    if type(recvbuf) is not _ndarray or recvbuf.ndim != 1 or recvbuf.nbytes > SMALL_BYTES:
        return
    in_place = sendbuf is IN_PLACE
    if not in_place and type(sendbuf) is not _ndarray:
        return
    st, op = state(comm), resolve_op(op)
    key = (recvbuf.size, recvbuf.dtype, op.name, algorithm, None if in_place else sendbuf.dtype,
           checks)
    if key in st.schedules:  # recorded, or found not to be replayed
        return
    s = st.setups.get(("allreduce", recvbuf.size, recvbuf.dtype, op.name, algorithm))
    if s is None:  # (a first call that calibrated the cost model set up in the old setups)
        return
    if (s.algo.placed or not s.algo.replayable  # (s: what the call set up)
            or recvbuf.size == 0 or comm.Get_size() == 1 or op.exact
            or (op is AVG and recvbuf.dtype.kind == "f" and recvbuf.itemsize == 2)):
        st.schedules.remember(key, PLANNED)
        return
    if debug_enabled() or default_timeout() is not None:  # (read once: they do not change)
        return
    buf = np.zeros(recvbuf.size, dtype=recvbuf.dtype)
    tmp = np.zeros(s.scratch, dtype=recvbuf.dtype)
    recorder = Recorder(op, [])  # (its log: the reductions of the round last yielded)
    rounds = s.algo.rounds(comm, buf, s.blocks, recorder, tmp, None)
    pre, steps = recorder.log, []
    for count, round_ in enumerate(rounds):
        recorder.log = []
        steps.append(_step((count, round_), recorder.log))
    st.schedules.remember(key, Schedule(buf, pre, steps, s.signed, st.tag(0, s.signed.sig)))


def _step(running: tuple, reductions: list) -> tuple:
    """A recorded round as the replay runs it: `running`, (round number, round), which a
    flight entry holds while it is in flight; for a send and a receive, the specs and peers
    of their one ``Sendrecv`` (`driver.exchange`'s, made once here), else Nones (the
    round goes to `driver.exchange`); then the reductions that follow it."""
    round_ = running[1]
    if len(round_) == 2 and type(round_[0]) is not type(round_[1]):
        send, recv = round_ if type(round_[0]) is Send else round_[::-1]
        return (running, [send.buf, MPI.BYTE], send.peer, [recv.buf, MPI.BYTE], recv.peer,
                reductions)
    return running, None, None, None, None, reductions
