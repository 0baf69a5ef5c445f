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
- ``Handle(comm, rounds, tag)`` is the nonblocking one: it posts each round with
  ``Isend``/``Irecv``; ``test()`` advances as far as it can without blocking and
  ``wait()`` drives it to the end.

Either way the same algorithm loop runs: there is no second copy of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterable
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from .buffers import (
    ScratchPool,
    from_host,
    is_device,
    msg,
    needs_staging,
    staging_mode,
    sync,
    to_host,
)


class Send(NamedTuple):
    """Send the array `buf` to rank `peer`."""

    buf: object
    peer: int


class Recv(NamedTuple):
    """Receive from rank `peer` into the array `buf`."""

    buf: object
    peer: int


Round = list  # of Send and Recv
Rounds = Generator[Round, None, None]


STAGING_POOL = ScratchPool()  # host buffers for staged device blocks, reused


class Staged(NamedTuple):
    """A round ready for MPI: the messages to post, and the copies around them."""

    round: Round
    fill: Callable[[], None] | None = None  # copy staged sends out (after receives are up)
    finish: Callable[[], None] | None = None  # copy staged receives back (round complete)


def stage(round_: Round, mode: str) -> Staged:
    """Prepare a round's buffers for MPI.

    Device buffers: wait for the current CUDA stream first (MPI must not read a
    block that a queued reduction is still writing). Where MPI cannot take device
    pointers (or MPIDP_STAGING=1), swap each buffer for a host buffer: `fill`
    copies the sends out, and `post` calls it only once the receives are posted,
    so incoming data flows while the sends are copied; `finish` copies the
    receives back once the round is done. Send and receive buffers are separate,
    and pooled across rounds and calls.
    """
    if mode == "host" or (mode != "all" and all(type(m.buf) is np.ndarray for m in round_)):
        return Staged(round_)  # the common case: host arrays, nothing to do
    if any(is_device(m.buf) for m in round_):
        sync(next(m.buf for m in round_ if is_device(m.buf)))
    if not any(needs_staging(m.buf, mode) for m in round_):
        return Staged(round_)
    wire, out, back, held = [], [], [], []
    for m in round_:
        if not needs_staging(m.buf, mode):
            wire.append(m)
            continue
        host = STAGING_POOL.take_host(m.buf)
        held.append(host)
        if type(m) is Send:
            out.append((m.buf, host))
            wire.append(Send(host, m.peer))
        else:
            wire.append(Recv(host, m.peer))
            back.append((host, m.buf))

    def fill() -> None:
        for src, host in out:
            to_host(src, host)

    def finish() -> None:
        for host, dst in back:
            from_host(host, dst)
        for host in held:
            STAGING_POOL.give(host)

    return Staged(wire, fill, finish)


def post(comm, round_: Round, tag: int, fill: Callable[[], None] | None = None) -> list:
    """Post every message of a round, receives first; return the requests.

    `fill` (staging) runs between the two: it copies the sends into place.
    """
    reqs = [comm.Irecv(msg(m.buf), m.peer, tag) for m in round_ if type(m) is Recv]
    if fill is not None:
        fill()
    reqs += [comm.Isend(msg(m.buf), m.peer, tag) for m in round_ if type(m) is Send]
    return reqs


def exchange(comm, round_: Round, tag: int, mode: str = "auto") -> None:
    """Complete one round, blocking, with the fewest MPI calls."""
    fill = finish = None
    if mode != "host":  # "host": NumPy buffers only, nothing to stage or sync
        round_, fill, finish = stage(round_, mode)
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
        mode: str | None = None) -> int:
    """Run a schedule to completion (the blocking collective); return its round count.

    Args:
        mode: the staging mode (`buffers.staging_mode`), or "host": every buffer is a
            NumPy array and nothing is staged (the plan knows; saves a check per round).
    """
    mode = staging_mode() if mode is None else mode
    count = 0
    for round_ in rounds:
        exchange(comm, round_, tag, mode)
        count += 1
    if on_done is not None:
        on_done()
    return count


class Handle:
    """A collective in flight. `test()` makes progress; `wait()` completes it.

    Args:
        comm, tag: where the rounds' messages are posted.
        rounds: the algorithm's generator; its first round is posted here.
        on_done: called once when the last round completes (gives back scratch,
            copies the result out).
    """

    __slots__ = ("_comm", "_tag", "_rounds", "_reqs", "_finish", "_mode", "_on_done", "_lock",
                 "done", "rounds")

    def __init__(self, comm, rounds: Rounds, tag: int,
                 on_done: Callable[[], None] | None = None, mode: str | None = None):
        self._comm, self._tag, self._rounds, self._on_done = comm, tag, rounds, on_done
        self._reqs: list = []
        self._finish = None  # copies staged receives back once the round is done
        self._mode = staging_mode() if mode is None else mode
        self._lock = threading.Lock()  # test() may race with a progress thread
        self.done = False
        self.rounds = 0  # rounds posted so far (the α term of the cost model)
        with self._lock:
            self._advance()

    def _advance(self) -> None:
        """Resume the generator: finish the last round's local work, post the next round."""
        if self._finish is not None:
            self._finish()
            self._finish = None
        try:
            round_ = next(self._rounds)
        except StopIteration:
            self._reqs = []
            self.done = True
            if self._on_done is not None:
                self._on_done()
            return
        self.rounds += 1
        round_, fill, self._finish = stage(round_, self._mode)
        self._reqs = post(self._comm, round_, self._tag, fill)

    def test(self) -> bool:
        """Complete every round that is ready and post the next; True when all are done.

        If another thread (a progress thread) is advancing this handle right now,
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

    def wait(self) -> None:
        """Block until the collective is complete."""
        with self._lock:
            while not self.done:
                if self._reqs:
                    MPI.Request.Waitall(self._reqs)
                self._advance()

    # mpi4py's spellings, so a Handle can stand where a request is expected.
    def Test(self) -> bool:  # noqa: N802
        return self.test()

    def Wait(self) -> None:  # noqa: N802
        self.wait()


def done_handle() -> Handle:
    """A Handle with nothing to do (count 0, one rank)."""
    return Handle(None, iter(()), 0)


def waitall(requests: Iterable) -> None:
    """Complete every Handle (or mpi4py request). All ranks pass theirs in the same order.

    Each pass advances every pending one without blocking, then blocks on the
    first one still pending: a rank blocked on handle i has finished 0..i-1, so the
    peers it waits for are never blocked on it.
    """
    pending = list(requests)
    while pending:
        pending = [r for r in pending if not _test(r)]
        if pending:
            pending[0].Wait()


def testall(requests: Iterable) -> bool:
    """Advance every Handle (or mpi4py request) once; True if all are complete."""
    return all([_test(r) for r in requests])


def _test(request) -> bool:
    # MPI.Request.test() returns a (flag, message) tuple; Test() is a plain bool
    return request.test() if isinstance(request, Handle) else bool(request.Test())
