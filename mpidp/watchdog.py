"""Watchdog: a collective that cannot finish ends the job with a clear error, not a hang.

When a host drops off the network, its peers' receives never complete and no
error ever comes back (TCP retries for minutes); when a rank dies or raises,
its peers wait for it forever. The tools here, none touching the schedule engine:

- `run(main)` calls an entry point's ``main`` and ends the whole job
  (``MPI_Abort``) if it raises on any rank, as ``python -m mpi4py`` does, even
  when the exception cannot be printed; ``python -m mpidp script.py`` runs a
  script that way, with a `Farewell` from each rank whose program ends cleanly,
  so that peers still waiting for it can name it when their deadline comes;
- `guard(timeout)` wraps any block of code, blocking collectives included: if
  the block goes `timeout` s without a ``kick()`` of its watchdog, a thread
  prints which rank gave up on what, then calls ``MPI.COMM_WORLD.Abort``
  (which ends every rank mpiexec can still reach); an exception leaving the
  block aborts the same way. ``guard("auto")`` is the trainer's default: a
  deadline of ``DEFAULT_FLOOR_S`` until the first kick, then of ``max(DEFAULT_FLOOR_S,
  DEFAULT_FACTOR x the longest stretch between two kicks so far)``. The timer
  costs nothing while the code runs;
- `wait(handle, timeout)` completes a nonblocking collective (`Request.wait`)
  and raises `TimeoutError`, naming the rank and the round, at the deadline.

``MPIDP_TIMEOUT`` (seconds, finite and > 0) is the deadline of a `guard` or a
`wait` not given one, so a launcher can arm every run: ``mpiexec -genv
MPIDP_TIMEOUT 60 ...`` (for ``guard("auto")``: after start-up, which gets at
least ``DEFAULT_FLOOR_S``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mpi4py import MPI

from . import endjob, flight
from .collectives.engine.completion import check_timeout, timeout_from_env
from .endjob import EXIT_ERROR, EXIT_TIMEOUT, FLIGHT_MARGIN_S, ExitAll, abort, end_job
from .farewell import Farewell

__all__ = ["EXIT_ERROR", "EXIT_TIMEOUT", "FLIGHT_MARGIN_S", "DEFAULT_FLOOR_S", "DEFAULT_FACTOR",
           "Dog", "ExitAll", "abort", "guard", "run", "wait"]

# guard("auto"): start-up (to the first kick: data, the broadcast, calibration) may last
# the floor; after that, any stretch between kicks the floor, or this multiple of the
# longest one seen so far if that is more.
DEFAULT_FLOOR_S = 60.0
DEFAULT_FACTOR = 10.0


def wait(handle, timeout: float | None = None, *, what: str = "collective") -> None:
    """Complete `handle` by polling ``handle.test()``; TimeoutError after `timeout` s.

    Args:
        timeout: seconds; None reads ``MPIDP_TIMEOUT``; if that is unset too, wait forever.
    """
    timeout = timeout_from_env() if timeout is None else check_timeout(timeout)
    try:
        handle.wait(timeout)  # mpidp's one completion policy (completion.waitall)
    except TimeoutError:
        rank = MPI.COMM_WORLD.Get_rank()
        raise TimeoutError(f"rank {rank}: {what} not complete after {timeout:g} s "
                           f"(round {getattr(handle, 'rounds', '?')}): a peer is dead, hangs "
                           "or disagrees on the arguments, or its link is down") from None


def run(main: Callable[[], int | None], what: str, comm=None, farewell: bool = False) -> int:
    """Call an entry point's `main()`; if it raises on this rank, end the whole job.

    A returned code is every rank's own (they agree, or the job would hang anyway):
    one other than 0 is raised as `ExitAll`, so that a launcher around this lets it
    through too. An exception on one rank, a ``sys.exit(n)`` with n != 0 included,
    aborts them all with one line naming the rank, after the traceback. `ExitAll`
    passes through::

        if __name__ == "__main__":
            sys.exit(watchdog.run(main, "train_mlp.py"))

    Args:
        farewell: say goodbye at a clean end (`Farewell`; collective, at the start too).
    """
    bye = None
    if farewell:
        bye = endjob.farewell = Farewell(MPI.COMM_WORLD)
        if flight.keep():
            flight.install()  # SIGUSR1 dumps (the main thread, before the program's)
            flight.learn_peers()
    try:
        code = main()
    except BaseException as e:  # noqa: BLE001 -- any escape must end the job, not hang it
        end_job(e, what, comm)  # it returns for ExitAll, and exit 0, only
        _leave(bye, e.code or 0, what, comm)
        raise
    code = 0 if code is None else code
    _leave(bye, code, what, comm)
    if code != 0:
        raise ExitAll(code)
    return 0


def _leave(bye: Farewell | None, code: int, what: str, comm) -> None:
    """Say goodbye and wait for the others' (ranks still running: it may take long)."""
    if bye is None:
        return
    try:
        bye.leave(code)
    except BaseException as e:  # noqa: BLE001 -- Ctrl-C meanwhile: end the job, as in main
        end_job(e, what, comm)
        raise


class Dog:
    """The deadline of a `guard`: `kick()` starts it again (call it once per step).

    Args:
        timeout: seconds, None for no deadline, or "auto": ``max(floor, factor x``
            the longest stretch between two kicks so far); before the first kick
            (start-up), the floor.
        startup: the deadline before the first kick, if not `timeout`'s.
    """

    def __init__(self, timeout: float | str | None, what: str, comm,
                 floor: float | None = None, factor: float | None = None,
                 startup: float | None = None):
        self.auto = timeout == "auto"
        self.floor = DEFAULT_FLOOR_S if floor is None else floor
        self.factor = DEFAULT_FACTOR if factor is None else factor
        self.timeout = self.floor if self.auto else timeout
        self.longest, self.kicks = 0.0, 0
        self.what, self.comm = what, comm
        self.last = time.monotonic()
        self.allowed = self.timeout if startup is None else startup  # this stretch's
        self.deadline = None if timeout is None else self.last + self.allowed
        self._stop = threading.Event()
        self._thread = None
        if timeout is not None:
            self._thread = threading.Thread(target=self._watch, name="mpidp-watchdog",
                                            daemon=True)
            self._thread.start()

    def kick(self) -> None:
        """Progress was made: the deadline is `timeout` s from now."""
        if self.timeout is None:
            return
        now = time.monotonic()
        if self.auto:
            if self.kicks:  # not start-up (data, the broadcast, calibration): the floor's
                self.longest = max(self.longest, now - self.last)
            self.timeout = max(self.floor, self.factor * self.longest)
        self.kicks += 1
        self.allowed = self.timeout
        self.last, self.deadline = now, now + self.allowed

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        # wake at least once a second: a deadline moved earlier (a test's) is seen in time
        while not self._stop.wait(min(1.0, max(0.0, self.deadline - time.monotonic()))):
            if time.monotonic() >= self.deadline:  # not kicked meanwhile
                how = "the default deadline; set MPIDP_TIMEOUT to change it, " if self.auto else ""
                abort(f"{self.what} made no progress for {self.allowed:g} s ({how}"
                      "a peer died, hangs or disagrees, or a link is down?)",
                      EXIT_TIMEOUT, self.comm)


@contextmanager
def guard(timeout: float | str | None = None, what: str = "run", comm=None) -> Iterator[Dog]:
    """Abort the job if the block raises, or runs `timeout` s past the last `kick()`.

    ::

        with watchdog.guard(30, "training") as dog:
            for step in range(steps):
                train_step()
                dog.kick()

    Args:
        timeout: seconds; None reads ``MPIDP_TIMEOUT``, and if that is unset, no
            deadline (exceptions still abort). "auto" (the trainer's): start-up, to
            the first kick, may last ``DEFAULT_FLOOR_S`` (or ``MPIDP_TIMEOUT`` if
            longer: it holds one-off work, imports, calibration); after it, each
            stretch between kicks ``MPIDP_TIMEOUT``, or if that is unset,
            ``max(DEFAULT_FLOOR_S, DEFAULT_FACTOR x`` the longest stretch so far).
        what: named in the message.
    """
    startup = None
    if timeout == "auto":
        fixed = timeout_from_env()
        if fixed is not None:
            timeout, startup = fixed, max(fixed, DEFAULT_FLOOR_S)
    elif timeout is None:
        timeout = timeout_from_env()
    else:
        timeout = check_timeout(timeout)
    dog = Dog(timeout, what, comm, startup=startup)
    try:
        yield dog
    except BaseException as e:  # noqa: BLE001 -- any escape must end the job, not hang it
        dog.stop()
        end_job(e, what, comm)
        raise
    finally:
        dog.stop()
