"""Watchdog: a collective that cannot finish ends the job with a clear error, not a hang.

When a host drops off the network, its peers' receives never complete and no
error ever comes back (TCP retries for minutes); when a rank dies, MPI may hang
too. Two tools, neither touching the schedule engine:

- `wait(handle, timeout)` drives a nonblocking collective with ``test()``
  (the engine's nonblocking step) and raises `TimeoutError` at the deadline;
- `guard(timeout)` wraps any block of code, blocking collectives included: if
  the block goes `timeout` s without a ``kick()`` of its watchdog, a thread
  prints which rank gave up on what, then calls
  ``MPI.COMM_WORLD.Abort`` (which ends every rank mpiexec can still reach);
  an exception leaving the block aborts the same way, so the other ranks do not
  wait forever for this one. The timer costs nothing while the code runs.

``MPIDP_TIMEOUT`` (seconds) is the default timeout of both, so a launcher can
arm every run: ``mpiexec -genv MPIDP_TIMEOUT 60 ...``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from mpi4py import MPI

EXIT_TIMEOUT = 124  # the code `timeout(1)` uses
EXIT_ERROR = 1
ABORT_GRACE_S = 5.0  # if Abort itself cannot finish (mpiexec out of reach), exit anyway
MESSAGE_S = 0.5  # between the message and Abort: time for mpiexec to forward the message


def timeout_from_env(default: float | None = None) -> float | None:
    """Seconds from ``MPIDP_TIMEOUT``, or `default` when it is unset or empty."""
    value = os.environ.get("MPIDP_TIMEOUT", "")
    return float(value) if value.strip() else default


def wait(handle, timeout: float | None = None, *, what: str = "collective") -> None:
    """Complete `handle` by polling ``handle.test()``; TimeoutError after `timeout` s.

    Args:
        timeout: seconds; None reads ``MPIDP_TIMEOUT``; if that is unset too, wait forever.
    """
    timeout = timeout_from_env() if timeout is None else timeout
    if timeout is None:
        handle.wait()
        return
    deadline = time.monotonic() + timeout
    pause = 1e-6
    while not handle.test():
        if time.monotonic() > deadline:
            rank = MPI.COMM_WORLD.Get_rank()
            raise TimeoutError(f"rank {rank}: {what} not complete after {timeout:g} s "
                               f"(round {getattr(handle, 'rounds', '?')}): "
                               "a peer is dead or its link is down")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)  # back off to 1 ms: little CPU, little added latency


def abort(message: str, code: int = EXIT_ERROR, comm=None) -> None:
    """Print `message` with this rank's number, then end the whole job."""
    comm = MPI.COMM_WORLD if comm is None else comm
    sys.stderr.write(f"mpidp: rank {comm.Get_rank()} of {comm.Get_size()}: {message}; "
                     "aborting the job\n")
    sys.stderr.flush()
    # The message travels to mpiexec through this host's proxy, and the abort by
    # another channel; were the abort first, mpiexec could tear the job down with
    # the message still in the pipe. A failed job can spare half a second.
    time.sleep(MESSAGE_S)
    # MPI_Abort asks mpiexec to kill every rank; if mpiexec is out of reach (our own
    # link is down) it may block, so a second timer makes sure this process ends.
    killer = threading.Timer(ABORT_GRACE_S, os._exit, (code,))
    killer.daemon = True
    killer.start()
    comm.Abort(code)
    os._exit(code)


class Dog:
    """The deadline of a `guard`: `kick()` starts it again (call it once per step)."""

    def __init__(self, timeout: float | None, what: str, comm):
        self.timeout, self.what, self.comm = timeout, what, comm
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._stop = threading.Event()
        self._thread = None
        if timeout is not None:
            self._thread = threading.Thread(target=self._watch, name="mpidp-watchdog",
                                            daemon=True)
            self._thread.start()

    def kick(self) -> None:
        """Progress was made: the deadline is `timeout` s from now."""
        if self.timeout is not None:
            self.deadline = time.monotonic() + self.timeout

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(max(0.0, self.deadline - time.monotonic())):
            if time.monotonic() >= self.deadline:  # not kicked meanwhile
                abort(f"{self.what} made no progress for {self.timeout:g} s "
                      "(a peer died or a link is down?)", EXIT_TIMEOUT, self.comm)


@contextmanager
def guard(timeout: float | None = None, what: str = "run", comm=None) -> Iterator[Dog]:
    """Abort the job if the block raises, or runs `timeout` s past the last `kick()`.

    ::

        with watchdog.guard(30, "training") as dog:
            for step in range(steps):
                train_step()
                dog.kick()

    Args:
        timeout: seconds; None reads ``MPIDP_TIMEOUT``; if that is unset, no deadline
            (exceptions still abort).
        what: named in the message.
    """
    dog = Dog(timeout_from_env() if timeout is None else timeout, what, comm)
    try:
        yield dog
    except SystemExit as e:
        if e.code not in (None, 0):
            dog.stop()
            abort(f"{what} exited with status {e.code}", EXIT_ERROR, comm)
        raise
    except BaseException as e:  # noqa: BLE001 -- any escape must end the job, not hang it
        dog.stop()
        traceback.print_exc()
        code = EXIT_TIMEOUT if isinstance(e, TimeoutError) else EXIT_ERROR
        abort(f"{what} failed: {type(e).__name__}: {e}", code, comm)
    finally:
        dog.stop()
