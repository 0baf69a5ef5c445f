"""Blocking calls replayed: a signature's schedule recorded once, then run without planning.

A blocking all-reduce of a few KiB, or an all-gather or broadcast on 2 ranks (one
message each way), takes longer in Python than on the wire: planning it (a `Plan`,
scratch, the algorithm's generator, its rounds) costs more than the exchange
(docs/benchmarks-notes.md, "Blocking calls replayed"). But a schedule depends only
on the signature (counts, dtype, op, root, algorithm) and the comm: which parts of
which buffer go to which peer in which round, and which reductions follow. So the
first call of a signature is planned, as every call was, and then recorded: its
generator runs again, dry, on stand-ins for the caller's buffers, and every array it
names is noted as an operand of a call: all of a caller's buffer, a part of one, or
a value the record keeps (`schedules`). Every later call replays the record on its own
buffers:

    first call of a signature (planned)       every later call (replayed here)
    -----------------------------------       ---------------------------------
    the call path: slot, checks, setup, tag   slot, the arrays' checks, tag
    the generator on the caller's buffers     the operands: [buf, src, parts, values]
    then `schedules.record`: the generator    per round: its Sendrecv, Send or Recv
    run dry on stand-ins, its rounds and      (or exchange) of operands, then the
    reductions noted as operands              reductions noted after it

A replayed call is a planned call on the wire: it takes its own slot and tag of the
comm's sequence (`state`), and it sends the messages its generator sends, from and
into the same places. So each rank replays or plans as it likes; the ranks need not
agree on which. Where a call's own work raises (a reduction), its slot goes back and
its flight entry says why, as a planned call's.

Replayed only where every condition holds (else the call is planned, as any other):
an MPI communicator (a comm-like object, `CountingComm` say, may carry a placement of
its own); 1-D NumPy arrays; a registered algorithm that writes only by receives and its
op (`Algorithm.replayable`) and runs on the caller's buffers as they are (an all-gather
into equal blocks, in place or from a sendbuf it `takes_src`); a plain op (no exact
sum, no float16 average) and at most `schedules.REDUCE_BYTES` for an all-reduce, whose
scratch the record keeps; more than one rank; and neither ``MPIDP_DEBUG`` (its agreement
check is the planned path's) nor ``MPIDP_TIMEOUT`` (a deadline is the `Request`'s).
The schedules are kept per communicator (`CommState.schedules`, at most
`state.SCHEDULES`) and forgotten with its cost model, as ``auto``'s picks may change.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import flight
from ..config import debug_enabled
from .engine.completion import default_timeout
from .engine.driver import exchange
from .plans import IN_PLACE
from .schedules import (  # noqa: F401 (blocking.record: api's; Schedule: the tests')
    PLANNED,
    Schedule,
    allgather_key,
    allreduce_key,
    bcast_key,
    record,
)
from .state import state

_BYTE, _Comm = MPI.BYTE, MPI.Comm
_RUNNING, _DONE = flight.RUNNING, flight.DONE


def allreduce(comm, sendbuf, recvbuf, op, algorithm: str, checks: str = "api") -> bool | None:
    """Replay a blocking all-reduce: True if it ran; else nothing is done (no slot taken)
    and the call is to be planned, then recorded (`record`) where the answer is None (no
    record is kept for it yet), not where it is False (not one to replay, or noted so).

    `checks`: whose checks of the kinds of arguments the recorded call passed, ``"api"``
    (`mpidp.allreduce`) or ``"mpi4py"`` (`mpidp.Comm.Allreduce`, whose rules differ).
    """
    if not isinstance(comm, _Comm):  # a comm-like may carry a placement of its own
        return False
    return _replay(comm, allreduce_key(sendbuf, recvbuf, op, algorithm, checks), recvbuf,
                   sendbuf)


def allgather(comm, sendbuf, recvbuf, algorithm: str, checks: str = "api") -> bool | None:
    """Replay a blocking all-gather into equal, packed blocks (no counts, no displs)."""
    if not isinstance(comm, _Comm):
        return False
    return _replay(comm, allgather_key(sendbuf, recvbuf, algorithm, checks), recvbuf, sendbuf)


def bcast(comm, buf, root, algorithm: str, checks: str = "api") -> bool | None:
    """Replay a blocking broadcast (its buffer checked as an in-place recvbuf: writable, so
    a read-only root's, which runs on a copy, is planned)."""
    if not isinstance(comm, _Comm):
        return False
    return _replay(comm, bcast_key(buf, root, algorithm, checks), buf, IN_PLACE)


def _pair(sendbuf, recvbuf) -> bool:
    """The checks of `checks.check_pair` that depend on the arrays themselves: recvbuf
    writable and contiguous, sendbuf (unless IN_PLACE) contiguous and apart from it.
    Their kinds (types, dtypes, 1-D) and sizes are in the record's key. A bad one is
    planned: the planned path's checks say what is wrong."""
    flags = recvbuf.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    return sendbuf is IN_PLACE or (sendbuf.flags.c_contiguous
                                   and not np.may_share_memory(sendbuf, recvbuf))


def _replay(comm, key: tuple | None, buf, src) -> bool | None:
    """Run the schedule recorded for `key` on this call's arrays, with the call's slot and
    tag: True. None where none is recorded yet; False where the call is not one to
    replay (now: a bad array, MPIDP_DEBUG, MPIDP_TIMEOUT; or ever: `PLANNED`)."""
    if key is None:
        return False
    st = state(comm)
    try:
        found = st.schedules.get(key)
    except TypeError:  # an unhashable argument (algorithm=["ring"]): planned, and refused
        return False
    if found is None:
        return None
    if (found is PLANNED or debug_enabled() or default_timeout() is not None
            or not _pair(src, buf)):
        return False
    slot = st.take()  # the call's number and tag, first of all (as `plan.Call`)
    tag, rec = found.tag_base + slot, st.flight
    entry = None if rec is None else rec.add(st.started - 1, found.signed, tag)
    if entry is not None and rec.agreeing is not None:
        rec.started()  # (a Split comm's id still being agreed on: its numbers go out)
    # the operands (`schedules`): buf, src, their parts, the record's own values
    v = [buf, None if src is IN_PLACE else src]
    for which, start, stop in found.parts:  # (a loop: a comprehension timed 0.3-0.8 µs more)
        v.append(v[which][start:stop])
    v += found.values
    try:
        for f, a, b, out in found.pre:
            f(v[a], v[b], v[out])
        for running, send, to, recv, source, reductions in found.steps:
            if entry is not None:  # the round in flight, for a flight dump
                entry[_RUNNING] = running
            if source is None:  # no receive: one send, or `send` holds the round's messages
                if to is not None:
                    comm.Send([v[send], _BYTE], to, tag)
                else:
                    exchange(comm, [kind(v[i], peer) for kind, i, peer in send], tag)
            elif to is None:  # one receive
                comm.Recv([v[recv], _BYTE], source, tag)
            else:  # one Sendrecv (`driver.exchange` spells these three so)
                comm.Sendrecv([v[send], _BYTE], to, tag, [v[recv], _BYTE], source, tag)
            for f, a, b, out in reductions:
                f(v[a], v[b], v[out])
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
