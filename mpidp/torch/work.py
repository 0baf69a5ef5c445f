"""torch's Work on mpidp's Request, and the progress thread that completes them.

Every collective of the backend is an mpidp nonblocking collective (a `Request`: a
generator of rounds that moves on when tested). `Work` wraps one or more of them with
what must happen once they are done (copy staged results back, unpack a gathered
buffer) and a `torch.futures.Future` that gets the output tensors then.

Who tests the requests: the `Progress` thread of the process group. It keeps the
works in flight in the order they started (every rank starts them in the same order)
and tests each in turn, sleeping ``interval_s`` between passes that moved nothing.
PyTorch's autograd engine computes in C++ with the GIL released, so while backward
runs this thread posts the next rounds of DDP's bucket reductions: the rounds advance
during the backward pass, not at its end. ``Work.wait`` tests too (the caller's thread
and the progress thread never advance one request at once: the request's lock).

Deadlines: a work not complete `timeout` seconds after it started (the process
group's timeout) fails: its future gets a `TimeoutError` naming the collective, and
`wait` raises it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.futures import Future

from ..collectives.engine.completion import likely_causes


class Work(dist._Work):
    """A collective in flight: mpidp requests, what to do when they are done, a future.

    Args:
        requests: mpidp requests (``test()``), or none (a completed collective).
        result: the tensors the future holds when done.
        finish: called once, after every request is complete (copies results out).
        name: the collective, for errors ("all_reduce").
        timeout: seconds after which the work fails with TimeoutError (None: never).
    """

    def __init__(self, requests: Sequence, result, finish: Callable[[], None] | None,
                 name: str, timeout: float | None):
        super().__init__()
        self.requests, self.result_, self._finish, self.name = list(requests), result, finish, name
        self.started = time.perf_counter()
        self.completed_at: float | None = None
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.error: BaseException | None = None
        self.future: Future = Future()
        self._lock = threading.Lock()  # the progress thread and wait() race to finish

    def poll(self, background: bool = False) -> bool:
        """Advance the requests without blocking; True (and the future set) once done.

        Past the deadline, the progress thread (`background`) only marks the work failed:
        its future is failed by the next `wait` or `poll` of a caller (failing a future
        from this thread while DDP's C++ reducer waits on it crashed the process, seen
        with torch 2.13); DDP's wait then lasts until the job's end (MPIDP_TIMEOUT's
        watchdog, or a peer's abort, which asks this rank for its flight record)."""
        if self.future.done():
            return True
        if self.error is not None:  # timed out in the progress thread
            if not background:
                self._fail(self.error)
            return True
        try:
            if not all([r.test() for r in self.requests]):
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise TimeoutError(
                        f"mpidp backend: {self.name} not complete after {self.timeout} s "
                        f"(the process group's timeout, or MPIDP_TIMEOUT): {likely_causes()}")
                return False
        except BaseException as exc:  # a failed reduction, a deadline: the future says so
            if background and isinstance(exc, TimeoutError):
                self.error = exc
            else:
                self._fail(exc)
            return True
        with self._lock:
            if not self.future.done():
                try:
                    if self._finish is not None:
                        self._finish()
                except BaseException as exc:
                    self.error = exc
                    self.future.set_exception(exc)
                    return True
                self.completed_at = time.perf_counter()
                self.future.set_result(self.result_)
        return True

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if not self.future.done():
                self.error = exc
                self.future.set_exception(exc)

    # ------------------------------------------------------------ torch's Work

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done (or `timeout`: TimeoutError, the work still in flight)."""
        limit = None
        if timeout is not None and timeout.total_seconds() > 0:
            limit = time.monotonic() + timeout.total_seconds()
        while not self.poll():
            if limit is not None and time.monotonic() > limit:
                raise TimeoutError(f"mpidp backend: {self.name} not complete after "
                                   f"{timeout.total_seconds()} s (wait's timeout)")
            time.sleep(0)  # the peers (and the progress thread) need the core and the GIL
        if self.error is not None:
            self._fail(self.error)
            raise self.error
        return True

    def get_future(self) -> Future:
        return self.future

    def is_completed(self) -> bool:
        return self.poll()

    def is_success(self) -> bool:
        return self.poll() and self.error is None

    def exception(self):
        return self.error

    def result(self):
        return self.result_

    def synchronize(self) -> None:
        self.wait()


class Progress:
    """A daemon thread that tests the works in flight, oldest first (see the module)."""

    def __init__(self, interval_s: float = 1e-4):
        self.interval_s = interval_s
        self._works: list[Work] = []
        self._cv = threading.Condition()
        self._stop = False
        self.passes = 0  # passes over the works in flight (what `stats` reports)
        self._thread = threading.Thread(target=self._loop, name="mpidp-progress", daemon=True)
        self._thread.start()

    def add(self, work: Work) -> None:
        with self._cv:
            self._works.append(work)
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._works and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                works = list(self._works)
            done = [w for w in works if w.poll(background=True)]
            self.passes += 1
            if done:
                with self._cv:
                    self._works = [w for w in self._works if w not in done]
            else:
                time.sleep(self.interval_s)  # let the compute thread have the GIL

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(5.0)


class InBackward:
    """Counts the all-reduces a group starts inside each backward pass: DDP's reducer
    starts its buckets' all-reduces there, in the buckets' order, so the k-th is bucket k."""

    def __init__(self):
        self.task, self.count = -1, 0  # autograd's graph task, all-reduces started in it

    def allreduce_started(self) -> int | None:
        """k for the k-th all-reduce started in the backward pass running now, else None."""
        task = _graph_task()
        if task < 0:
            return None
        self.count = self.count + 1 if task == self.task else 0
        self.task = task
        return self.count


def _graph_task() -> int:
    """The id of the backward pass running on this thread (torch's autograd), or -1."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return -1 if current is None else current()


class Tested:
    """An mpi4py request with mpidp's `test()` (mpi4py's own returns a (flag, msg) pair)."""

    __slots__ = ("request",)

    def __init__(self, request: MPI.Request):
        self.request = request

    def test(self) -> bool:
        return self.request.Test()
