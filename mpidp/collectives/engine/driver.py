"""Schedules: a collective is a generator of rounds; a driver runs them.

Each algorithm is written once, as a generator. A round is the list of
messages that may be in flight together; the generator yields it and, when it
resumes, the round is complete and it does the round's local work (a
reduction) before yielding the next::

    def ring_allgather(comm, buf, blocks):
        for step in range(n - 1):
            yield [Send(block_a, right), Recv(block_b, left)]   # round `step`
            # both messages done here: reduce, then loop to the next round

The generator only describes the messages; the driver posts them on the comm
with the collective's tag:

- ``run(comm, rounds, tag)`` is the blocking collective: a round of one send and
  one receive becomes one ``Sendrecv``, any other round ``Isend``/``Irecv`` +
  ``Waitall``.
- ``Request(comm, rounds, tag)`` is the nonblocking one: it posts each round with
  ``Isend``/``Irecv``; ``test()`` advances as far as it can without blocking and
  ``wait()`` drives it to the end.

Either way the same algorithm loop runs: there is no second copy of it. Device
buffers are the business of a `staging.Stager`, which the plan hands over (or
None: NumPy buffers need nothing).

Completing many requests (`waitall` and the others, one policy for mpidp's
requests and mpi4py's) is `completion`'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from mpi4py import MPI

from ... import flight
from ..algorithms.rounds import Recv, Round, Rounds, Send
from . import completion
from .completion import Polled, default_timeout, waitall
from .staging import Stager, msg

BYTE = MPI.BYTE


def post(comm, round_: Round, tag: int, fill: Callable[[], None] | None = None) -> list:
    """Post every message of a round, receives first; return the requests.

    `fill` (staging) runs between the two: it copies the sends into place.
    """
    reqs = [comm.Irecv(msg(m.buf), m.peer, tag) for m in round_ if type(m) is Recv]
    if fill is not None:
        fill()
    reqs += [comm.Isend(msg(m.buf), m.peer, tag) for m in round_ if type(m) is Send]
    return reqs


def exchange(comm, round_: Round, tag: int, stager: Stager | None = None) -> None:
    """Complete one round, blocking, with the fewest MPI calls: a send and a receive as
    one ``Sendrecv``, a lone message as ``Send`` or ``Recv`` (an MPI communicator's)."""
    fill = finish = None
    if stager is not None:
        round_, fill, finish = stager(round_)
    if len(round_) == 2 and type(round_[0]) is not type(round_[1]):
        if fill is not None:
            fill()
        send, recv = round_ if type(round_[0]) is Send else round_[::-1]
        # (`msg`'s spec, spelled out: this line runs in every round of a small collective)
        comm.Sendrecv([send.buf, BYTE], send.peer, tag, [recv.buf, BYTE], recv.peer, tag)
    elif len(round_) == 1 and isinstance(comm, MPI.Comm):  # (a comm-like may have no Send)
        if fill is not None:
            fill()
        m = round_[0]
        if type(m) is Send:
            comm.Send([m.buf, BYTE], m.peer, tag)
        else:
            comm.Recv([m.buf, BYTE], m.peer, tag)
    elif round_:
        MPI.Request.Waitall(post(comm, round_, tag, fill))
    if finish is not None:
        finish()


_RUNNING = flight.RUNNING  # (one global load a round, not two)
_DONE = flight.DONE


def run(comm, rounds: Rounds, tag: int, on_done: Callable[[], None] | None = None,
        stager: Stager | None = None, on_fail: Callable[[], None] | None = None,
        entry: list | None = None) -> int:
    """Run a schedule to completion (the blocking collective); return its round count.

    `on_fail` is called if the schedule raises (its own work, or an MPI call: either
    way after its round's messages are done with). With ``MPIDP_TIMEOUT`` set, the
    rounds are polled against that deadline instead (`Request`). `entry`: the call's
    flight record, handed what runs (``flight.RUNNING``) so that a dump can say which
    round is in flight, and ``flight.DONE`` once all have run (its state derived from
    it: no other store marks a blocking call complete); a deadline that passes leaves
    the request there.
    """
    if default_timeout() is not None:
        if entry is not None:  # (started, as the request posts its first round)
            entry[_RUNNING] = (0, None)
        request = Request(comm, rounds, tag, on_done, stager, on_fail)
        if entry is not None:
            entry[_RUNNING] = request
        request.wait()
        if entry is not None:
            entry[_RUNNING] = _DONE
        return request.rounds
    count = 0
    try:
        for round_ in rounds:
            if entry is not None:  # (the entry's state reads "started" from here on)
                entry[_RUNNING] = (count, round_)
            exchange(comm, round_, tag, stager)
            count += 1
    except BaseException:
        if entry is not None:
            entry[_RUNNING] = None  # pins none of the caller's arrays
        if on_fail is not None:
            on_fail()
        raise
    if entry is not None:  # (the entry's state reads "complete" from here on; it pins
        entry[_RUNNING] = _DONE  # none of the caller's arrays)
    if on_done is not None:
        on_done()
    return count


class RequestError(MPI.Exception):
    """What `Request.Cancel` and `Request.Free` raise: an ``MPI.Exception``
    (``MPI.ERR_REQUEST``), the type MPICH and Open MPI raise there, saying why."""

    def __init__(self, message: str):
        super().__init__(MPI.ERR_REQUEST)
        self.message = message

    def __str__(self) -> str:
        return self.message


class FreedError(MPI.Exception):
    """The communicator was freed (``comm.Free()``) while an mpidp collective was in flight
    on it: ``MPI.Exception`` (``MPI.ERR_COMM``) saying what to do instead."""

    def __init__(self):
        super().__init__(MPI.ERR_COMM)

    def __str__(self) -> str:
        return ("the communicator was freed (comm.Free()) while this mpidp collective was in "
                "flight: its next round cannot be posted. Wait for the request before "
                "freeing the communicator, or free it through mpidp.Comm, whose Free() "
                "completes it first")


class Request(Polled):
    """A collective in flight, with the methods of an mpi4py ``MPI.Request``.

    `test()` completes every round that is ready and posts the next; `wait()`
    drives it to the end. ``Test``/``Wait``/``Get_status``/``Cancel``/``Free`` and
    the static ``Waitall``/``Testall``/``Waitany``/``Testany``/``Waitsome``/
    ``Testsome`` are mpi4py's spellings; the static ones take mpidp's and mpi4py's
    requests mixed (mpi4py's own ``MPI.Request.Waitall`` takes MPI requests only).

    If the collective's own work raises (a reduction, a staging copy: between
    rounds, when none of its messages is in flight), the exception goes to the
    caller of `test`/`wait`, `on_fail` is called, and the request is failed: every
    later `test` or `wait` raises again (it never completes), and `error` holds the
    exception.

    Args:
        comm, tag: where the rounds' messages are posted.
        rounds: the algorithm's generator; its first round is posted here.
        on_done: called once when the last round completes (gives back scratch,
            copies the result out, frees the tag).
        stager: prepares rounds with device buffers for MPI (None: NumPy only).
        on_fail: called once if the rounds raise (gives back scratch and the tag).
    """

    __slots__ = ("_comm", "_tag", "_rounds", "_reqs", "_finish", "_stager", "_on_done",
                 "_on_fail", "_lock", "_active", "done", "error", "rounds", "completed_at",
                 "_round")

    def __init__(self, comm, rounds: Rounds, tag: int,
                 on_done: Callable[[], None] | None = None, stager: Stager | None = None,
                 on_fail: Callable[[], None] | None = None):
        self._comm, self._tag, self._rounds, self._on_done = comm, tag, rounds, on_done
        self._on_fail = on_fail
        self._reqs: list = []
        self._finish = None  # copies staged receives back once the round is done
        self._stager = stager
        self._lock = threading.Lock()  # test() may race with a progress thread
        self.done = False
        self.error: BaseException | None = None  # what the collective's own work raised
        self.rounds = 0  # rounds posted so far (the α term of the cost model)
        self.completed_at: float | None = None  # time.perf_counter() when it completed
        self._active = True  # not yet reported complete by Test/Wait (MPI: not REQUEST_NULL)
        self._round: Round | None = None  # the round posted last (read by a flight dump)
        with self._lock:
            self._advance()

    def _advance(self) -> None:
        """Finish the round, take the next one, post it."""
        self._check_failed()
        try:
            if self._finish is not None:
                self._finish()
                self._finish = None
            round_ = next(self._rounds, None)
        except BaseException as exc:
            self._failed(exc)
            raise
        if round_ is None:
            self._reqs, self._round = [], None
            self.done = True
            self.completed_at = time.perf_counter()
            if self._on_done is not None:
                self._on_done()
            # a completed request pins no buffer: its generator, callback and stager
            # reference the caller's arrays, which may be freed now (ZeRO stage 2's buckets);
            # nor its communicator: a comm-like's state, whose flight record holds this
            # request, is kept while the comm-like lives (`state`), and would keep it alive
            self._rounds = self._on_done = self._on_fail = self._stager = self._comm = None
            return
        self.rounds += 1
        fill = None
        if self._stager is not None:
            round_, fill, self._finish = self._stager(round_)
        self._round = round_
        try:
            self._reqs = post(self._comm, round_, self._tag, fill)
        except MPI.Exception:
            if not (isinstance(self._comm, MPI.Comm) and self._comm == MPI.COMM_NULL):
                raise
            exc = FreedError()  # comm.Free() while in flight: say so, not "Null communicator"
            self._failed(exc)
            raise exc from None

    def _failed(self, exc: BaseException) -> None:
        """The collective's own work raised: nothing of it is in flight; give back what
        it holds (`on_fail`) and drop the references to the caller's arrays."""
        self.error, self._reqs, self._round = exc, [], None
        on_fail = self._on_fail
        self._rounds = self._on_done = self._on_fail = self._stager = self._finish = None
        self._comm = None
        if on_fail is not None:
            on_fail()

    def Get_status(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """True if the collective is complete (it makes progress, like MPI's); stays active."""
        return self.test()

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
        if not self.test():
            raise RequestError("an mpidp collective in flight cannot be freed: it advances "
                               "only when tested; Wait() for it, then free it")
        self._active = False

    @staticmethod
    def Waitall(requests: Sequence, statuses=None) -> bool:  # noqa: N802
        """Complete every request, mpidp's and mpi4py's (`completion.waitall`)."""
        waitall(requests)
        return True

    @staticmethod
    def Testall(requests: Sequence, statuses=None) -> bool:  # noqa: N802
        """Advance every request once; True if all are complete."""
        return completion.testall(requests)

    Waitany = staticmethod(completion.waitany)
    Testany = staticmethod(completion.testany)
    Waitsome = staticmethod(completion.waitsome)
    Testsome = staticmethod(completion.testsome)

    def __repr__(self) -> str:
        return f"<mpidp.Request {'done' if self.done else 'pending'}, {self.rounds} rounds>"


# `mpidp.Handle`: another name of the same class, as docs/dropin.md says (the design's
# word for a driven generator; `Request` is mpi4py's)
Handle = Request

