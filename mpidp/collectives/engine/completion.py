"""Completing requests: one policy for mpidp's requests and mpi4py's, and the deadlines.

An mpidp collective advances round by round, and only when someone tests it. So
every function here polls: each pass advances every pending request without
blocking in any one of them, then yields the core (`os.sched_yield`) to the
processes the peers run in. Blocking in one request would advance only that
collective, while a peer may need another one to move first; and on ranks that
share cores a spinning rank takes the time its peers need.

``MPIDP_TIMEOUT`` (seconds, read once) is the deadline of every wait not given
one: `TimeoutError` then, with the requests still in flight (their messages stay
posted and may still complete). mpi4py's own ``MPI.Request.Waitall`` and its
siblings take MPI requests only; these take both, mixed, in any order.

One mpidp request completes by `Polled`'s `test` and `wait`, the methods that a
`driver.Request` (the rounds of a generator) and a `replay.Replay` (a recorded run)
share.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Sequence

from mpi4py import MPI

from ... import config


def check_timeout(value, name: str = "timeout") -> float:
    """`value` as seconds: a finite number > 0, or ValueError saying what is wrong."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):  # nan spins, inf overflows, <= 0 fires
        raise ValueError(f"{name}={value!r}: expected a finite number of seconds > 0")
    return seconds


def timeout_from_env(default: float | None = None) -> float | None:
    """Seconds from ``MPIDP_TIMEOUT`` (read now), or `default` when it is unset or empty.

    ConfigError (a ValueError) if it is set to anything but a finite number > 0.
    """
    seconds = config.get("MPIDP_TIMEOUT")
    return default if seconds is None else seconds


class Polled:
    """What a collective in flight does on its own: `Request` (the rounds of a generator)
    and `replay.Replay` (a recorded run) share it.

    A subclass keeps ``_reqs`` (the MPI requests of the round in flight), ``done``,
    ``_lock`` (a progress thread may test while the owner waits) and ``_active``,
    and says in ``_advance`` what follows a complete round. Here: `test`, `wait`,
    `wait_round` (a progress thread's), and mpi4py's spellings ``Test``/``Wait``,
    which, as an MPI request becomes ``MPI.REQUEST_NULL`` once reported complete,
    make it inactive: false as a bool, and skipped by Waitany and the like.
    """

    __slots__ = ()

    def _check_failed(self) -> None:
        """A collective whose own work raised (`error`) never completes: say so, again."""
        if self.error is not None:
            raise RuntimeError(f"this collective failed earlier ({self.error!r}); it will "
                               "never complete") from self.error

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
        """Block until the collective is complete; TimeoutError after `timeout` seconds
        (None: ``MPIDP_TIMEOUT``, if set; else no limit).

        After a timeout the collective is still in flight: its messages stay posted
        and may yet complete (call `wait` again). A peer that never joins it leaves
        the communicator unusable for mpidp's collectives: free it or end the job.
        """
        timeout = default_timeout() if timeout is None else timeout
        if timeout is not None:
            waitall([self], timeout)
            return
        lock = self._lock
        lock.acquire()  # (not `with`: 0.05 µs against 0.13, on every wait's path)
        try:
            while not self.done:
                if self._reqs:
                    MPI.Request.Waitall(self._reqs)
                self._advance()
        finally:
            lock.release()

    def wait_round(self) -> bool:
        """Block inside MPI (the GIL released) until the current round's messages are
        done, then post the next round; True once the collective is complete.

        What a progress thread calls: it sleeps in the MPI library instead of polling,
        and other threads run Python meanwhile. If another thread is advancing this
        request right now, return False at once (as `test`). It does not honour a
        timeout: a peer that never joins keeps it blocked (use `wait` for that).
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if not self.done:
                if self._reqs:
                    MPI.Request.Waitall(self._reqs)
                self._advance()
            return self.done
        finally:
            self._lock.release()

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Make progress without blocking; True when the collective is complete."""
        if self.test():
            self._active = False
            return True
        return False

    def Wait(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Block until the collective is complete; returns True, as mpi4py's does."""
        self.wait()
        self._active = False
        return True

    def __bool__(self) -> bool:
        return self._active


_UNSET = object()
_default_timeout = _UNSET


def default_timeout() -> float | None:
    """``MPIDP_TIMEOUT`` (seconds), read once: the deadline of every wait not given one.

    Set, it bounds blocking collectives and waits alike (TimeoutError), so that a
    program whose ranks disagree, or whose peer died, ends instead of hanging.
    """
    global _default_timeout
    if _default_timeout is _UNSET:
        _default_timeout = timeout_from_env()
    return _default_timeout


def _test(request) -> bool:
    # Test(), not test(): mpi4py's test() returns a (flag, message) tuple, and a request
    # reported complete becomes inactive (MPI: REQUEST_NULL), mpidp's as mpi4py's
    return bool(request.Test())


def waitall(requests: Iterable, timeout: float | None = None) -> None:
    """Complete every request (mpidp's or mpi4py's), in any order the peers allow.

    TimeoutError after `timeout` seconds (None: ``MPIDP_TIMEOUT``, if set).
    """
    pending = list(requests)
    timeout = default_timeout() if timeout is None else timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pending = [r for r in pending if not _test(r)]
        if not pending:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} request(s) not complete after {timeout} s: "
                               f"{likely_causes()}")
        os.sched_yield()


def likely_causes() -> str:
    """Why a collective may not complete, for a deadline's message: the agreement check is
    suggested only where it is off; where it is on, what it does not see."""
    if not config.debug_enabled():
        return ("a peer has not joined the collective, or ranks disagree on its arguments "
                "(count, dtype, op, root, algorithm; MPIDP_DEBUG=1 checks them)")
    return ("a peer has not joined the collective. MPIDP_DEBUG is on, so ranks that disagree "
            "on the arguments would have raised; look at the other ranks' output: a peer "
            "raised (at a collective started by two threads at once, say), died, hangs, or "
            "called the collectives in another order")


def testall(requests: Iterable) -> bool:
    """Advance every request (mpidp's or mpi4py's) once; True if all are complete."""
    return all([_test(r) for r in requests])


# The *any and *some forms follow MPI: a request reported complete becomes inactive
# (an MPI request becomes MPI.REQUEST_NULL, an mpidp one false), and is skipped.

def _mpi_only(requests: Sequence) -> bool:
    return all(isinstance(r, MPI.Request) for r in requests)


def testany(requests: Sequence, status=None) -> tuple[int, bool]:
    """Advance the active requests in order until one completes: ``(index, True)``;
    ``(MPI.UNDEFINED, True)`` if none is active, ``(MPI.UNDEFINED, False)`` if none is done."""
    if _mpi_only(requests):
        return MPI.Request.Testany(requests, status)
    active = [i for i, r in enumerate(requests) if r]  # REQUEST_NULL and reported: false
    for i in active:
        if requests[i].Test(status):
            return i, True
    return MPI.UNDEFINED, not active


def waitany(requests: Sequence, status=None) -> int:
    """Complete one active request; its index, or ``MPI.UNDEFINED`` if none is active."""
    if _mpi_only(requests):
        return MPI.Request.Waitany(requests, status)
    while True:
        index, flag = testany(requests, status)
        if flag:
            return index
        os.sched_yield()


def testsome(requests: Sequence, statuses=None) -> list[int] | None:
    """Advance every active request once; the indices of those completed (None: none active)."""
    if _mpi_only(requests):
        return MPI.Request.Testsome(requests, statuses)
    active = [i for i, r in enumerate(requests) if r]
    return [i for i in active if requests[i].Test()] if active else None


def waitsome(requests: Sequence, statuses=None) -> list[int] | None:
    """Complete at least one active request; the indices completed (None: none active)."""
    if _mpi_only(requests):
        return MPI.Request.Waitsome(requests, statuses)
    while True:
        done = testsome(requests, statuses)
        if done is None or done:
            return done
        os.sched_yield()
