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
buffers are the business of a `buffers.Stager`, which the plan hands over (or
None: NumPy buffers need nothing).

Completion policy (`waitall`, used by `mpidp.Comm`, `DataParallel` and users):
poll every pending request, mpidp's and mpi4py's alike, and yield the core
between passes. Blocking in one request would advance only that collective, and a
peer may need another one to move first; on ranks that share cores, a spinning
rank would take the time its peers need.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import NamedTuple

from mpi4py import MPI

from .buffers import Stager, msg


class Send(NamedTuple):
    """Send the array `buf` to rank `peer`."""

    buf: object
    peer: int
    outgoing = True  # (a class attribute, not a field) what staging copies out first


class Recv(NamedTuple):
    """Receive from rank `peer` into the array `buf`."""

    buf: object
    peer: int
    outgoing = False


Round = list  # of Send and Recv
Rounds = Generator[Round, None, None]


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
    """Complete one round, blocking, with the fewest MPI calls."""
    fill = finish = None
    if stager is not None:
        round_, fill, finish = stager(round_)
    if len(round_) == 2 and type(round_[0]) is not type(round_[1]):
        if fill is not None:
            fill()
        send, recv = round_ if type(round_[0]) is Send else round_[::-1]
        comm.Sendrecv(msg(send.buf), send.peer, tag, msg(recv.buf), recv.peer, tag)
    elif round_:
        MPI.Request.Waitall(post(comm, round_, tag, fill))
    if finish is not None:
        finish()


def run(comm, rounds: Rounds, tag: int, on_done: Callable[[], None] | None = None,
        stager: Stager | None = None) -> int:
    """Run a schedule to completion (the blocking collective); return its round count."""
    count = 0
    for round_ in rounds:
        exchange(comm, round_, tag, stager)
        count += 1
    if on_done is not None:
        on_done()
    return count


class Request:
    """A collective in flight, with the methods of an mpi4py ``MPI.Request``.

    `test()` completes every round that is ready and posts the next; `wait()`
    drives it to the end. ``Test``/``Wait``/``Get_status`` and the static
    ``Waitall``/``Testall`` are mpi4py's spellings; the static ones take mpidp's
    and mpi4py's requests mixed (mpi4py's own ``MPI.Request.Waitall`` takes MPI
    requests only).

    Args:
        comm, tag: where the rounds' messages are posted.
        rounds: the algorithm's generator; its first round is posted here.
        on_done: called once when the last round completes (gives back scratch,
            copies the result out, frees the tag).
        stager: prepares rounds with device buffers for MPI (None: NumPy only).
    """

    __slots__ = ("_comm", "_tag", "_rounds", "_reqs", "_finish", "_stager", "_on_done",
                 "_lock", "done", "rounds", "completed_at")

    def __init__(self, comm, rounds: Rounds, tag: int,
                 on_done: Callable[[], None] | None = None, stager: Stager | None = None):
        self._comm, self._tag, self._rounds, self._on_done = comm, tag, rounds, on_done
        self._reqs: list = []
        self._finish = None  # copies staged receives back once the round is done
        self._stager = stager
        self._lock = threading.Lock()  # test() may race with a progress thread
        self.done = False
        self.rounds = 0  # rounds posted so far (the α term of the cost model)
        self.completed_at: float | None = None  # time.perf_counter() when it completed
        with self._lock:
            self._advance()

    def _advance(self) -> None:
        """Finish the round, take the next one, post it."""
        if self._finish is not None:
            self._finish()
            self._finish = None
        round_ = next(self._rounds, None)
        if round_ is None:
            self._reqs = []
            self.done = True
            self.completed_at = time.perf_counter()
            if self._on_done is not None:
                self._on_done()
            # a completed request pins no buffer: its generator, callback and stager
            # reference the caller's arrays, which may be freed now (ZeRO stage 2's buckets)
            self._rounds = self._on_done = self._stager = None
            return
        self.rounds += 1
        fill = None
        if self._stager is not None:
            round_, fill, self._finish = self._stager(round_)
        self._reqs = post(self._comm, round_, self._tag, fill)

    def test(self) -> bool:
        """Complete every round that is ready and post the next; True when all are done.

        If another thread (a progress thread) is advancing this request right now,
        return False at once instead of waiting for its reduction to finish.
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            while not self.done:
                if self._reqs and not MPI.Request.Testall(self._reqs):
                    return False
                self._advance()
            return True
        finally:
            self._lock.release()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the collective is complete; TimeoutError after `timeout` seconds.

        After a timeout the collective is still in flight: its messages stay posted
        and may yet complete (call `wait` again). A peer that never joins it leaves
        the communicator unusable for mpidp's collectives: free it or end the job.
        """
        if timeout is not None:
            waitall([self], timeout)
            return
        with self._lock:
            while not self.done:
                if self._reqs:
                    MPI.Request.Waitall(self._reqs)
                self._advance()

    # mpi4py's spellings, so that a Request stands where an MPI.Request is expected
    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Make progress without blocking; True when the collective is complete."""
        return self.test()

    def Wait(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Block until the collective is complete; returns True, as mpi4py's does."""
        self.wait()
        return True

    def Get_status(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """True if the collective is complete (it makes progress, like MPI's)."""
        return self.test()

    @staticmethod
    def Waitall(requests: Sequence, statuses=None) -> bool:  # noqa: N802
        """Complete every request, mpidp's and mpi4py's (`waitall`)."""
        waitall(requests)
        return True

    @staticmethod
    def Testall(requests: Sequence, statuses=None) -> bool:  # noqa: N802
        """Advance every request once; True if all are complete."""
        return testall(requests)

    def __repr__(self) -> str:
        return f"<mpidp.Request {'done' if self.done else 'pending'}, {self.rounds} rounds>"


Handle = Request  # the name the documents used first; one class


def done_request() -> Request:
    """A Request with nothing to do (count 0, one rank)."""
    return Request(None, iter(()), 0)


def waitall(requests: Iterable, timeout: float | None = None) -> None:
    """Complete every request (mpidp's or mpi4py's), in any order the peers allow.

    Each pass advances every pending one without blocking, then yields the core
    (`os.sched_yield`) to the processes the peers run in. TimeoutError after
    `timeout` seconds, with the requests still in flight (see `Request.wait`).
    """
    pending = list(requests)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pending = [r for r in pending if not _test(r)]
        if not pending:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(pending)} request(s) not complete after {timeout} s: a peer has not "
                "joined the collective, or ranks disagree on its arguments (count, dtype, "
                "op, root, algorithm; MPIDP_DEBUG=1 checks them)")
        os.sched_yield()


def testall(requests: Iterable) -> bool:
    """Advance every request (mpidp's or mpi4py's) once; True if all are complete."""
    return all([_test(r) for r in requests])


def _test(request) -> bool:
    # mpi4py's MPI.Request.test() returns a (flag, message) tuple; Test() is a plain bool
    return request.test() if isinstance(request, Request) else bool(request.Test())
