"""A progress thread: the reductions in flight advanced in the background, not only at hooks.

A schedule moves on only when it is called into. `DataParallel` calls into its
requests at every hook of backward; a `ProgressThread` also does so from a thread
of its own, in one of two designs:

    "poll"   test every request in flight, sleep `interval_s` (the compute thread
             needs the GIL), again
    "wait"   block inside MPI (the GIL released) on the current round of the oldest
             request in flight, post its next round, and move on to the next

Both need ``MPI_THREAD_MULTIPLE``. docs/overlap.md measures them against no thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mpi4py import MPI

from .. import collectives as mp

INTERVAL_S = 1e-4  # the poll's sleep, and the wait's when the compute thread holds the request


def kind(progress_thread: bool | str) -> str | None:
    """The design asked for ("poll" for True, None for False); ValueError if unknown,
    RuntimeError where MPI runs without ``MPI_THREAD_MULTIPLE``."""
    if progress_thread not in (False, True, "wait", "poll"):
        raise ValueError(f"progress_thread must be False, True, 'wait' or 'poll', "
                         f"not {progress_thread!r}")
    if progress_thread and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise RuntimeError("progress_thread needs MPI_THREAD_MULTIPLE")
    return ("poll" if progress_thread is True else progress_thread) or None


class ProgressThread:
    """A daemon thread advancing ``inflight()`` (the requests in flight, oldest first)."""

    def __init__(self, kind: str, inflight: Callable[[], list], interval_s: float = INTERVAL_S):
        self.kind, self.inflight, self.interval_s = kind, inflight, interval_s
        self._stop, self._work = False, threading.Event()
        loop = self._poll if kind == "poll" else self._wait
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Something new is in flight: wake the thread if it idles."""
        self._work.set()

    def _idle(self) -> None:
        self._work.wait(0.1)
        self._work.clear()

    def _poll(self) -> None:
        while not self._stop:
            inflight = self.inflight()
            if inflight and not mp.testall(inflight):
                time.sleep(self.interval_s)  # let the compute thread have the GIL
            else:
                self._idle()

    def _wait(self) -> None:
        while not self._stop:
            oldest = next((r for r in self.inflight() if not r.done), None)
            if oldest is None:
                self._idle()
            elif not (oldest.wait_round() if hasattr(oldest, "wait_round") else oldest.Test()):
                time.sleep(self.interval_s)  # the compute thread is advancing it: let it

    def close(self) -> None:
        """Stop the thread (a "wait" thread blocked on a request that never completes, after
        a timed-out backward, stays: a daemon)."""
        self._stop = True
        self._work.set()
        self._thread.join(10.0)
