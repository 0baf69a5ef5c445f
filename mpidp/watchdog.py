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

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mpi4py import MPI

from . import flight
from .collectives.engine.completion import check_timeout, timeout_from_env
from .farewell import Farewell

EXIT_TIMEOUT = 124  # the code `timeout(1)` uses
EXIT_ERROR = 1
ABORT_GRACE_S = 5.0  # if Abort itself cannot finish (mpiexec out of reach), exit anyway
MESSAGE_S = 0.5  # between the message and Abort: time for mpiexec to forward the message
# guard("auto"): start-up (to the first kick: data, the broadcast, calibration) may last
# the floor; after that, any stretch between kicks the floor, or this multiple of the
# longest one seen so far if that is more. A digits step takes ~1 ms, start-up ~1-3 s.
DEFAULT_FLOOR_S = 60.0
# After its flight record is written (mpidp.flight), a rank waits this long before the
# abort: the other ranks' deadlines pass at about the same time, and the abort ends them,
# so it leaves them the time to write theirs (a few ms each, more under load).
FLIGHT_MARGIN_S = 2.0
DEFAULT_FACTOR = 10.0


class ExitAll(SystemExit):
    """Every rank raises this at the same point (after agreeing): exit, no Abort needed."""


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


_farewell: Farewell | None = None  # the launcher's, if this process runs under it


def _departures(comm) -> str:
    """'; rank 1 had already left (...)' for the ranks whose program ended, or ''."""
    if _farewell is None:
        return ""
    world = MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT)
    who = "rank" if world else "world rank"  # the goodbyes are numbered in the world
    return "".join(f"; {who} {r} had already left (its program ended with status {code})"
                   for r, code in sorted(_farewell.left().items()))


def _text(obj, kind: str = "") -> str:
    """str(obj), or a note saying so if its ``__str__`` raises (anything, even SystemExit)."""
    try:
        return str(obj)
    except BaseException:  # noqa: BLE001 -- whatever it raises, the job must still end
        return f"<{kind or type(obj).__name__ + ' object'}: str() failed>"


def _exit_later(code: int) -> None:
    """End this process in a few seconds, whatever happens meanwhile (mpiexec then ends
    the others: a rank's non-zero exit ends the job)."""
    killer = threading.Timer(MESSAGE_S + ABORT_GRACE_S + FLIGHT_MARGIN_S, os._exit, (code,))
    killer.daemon = True
    killer.start()


def abort(message: str, code: int = EXIT_ERROR, comm=None) -> None:
    """Print `message` with this rank's number, then end the whole job."""
    comm = MPI.COMM_WORLD if comm is None else comm
    # MPI_Abort asks mpiexec to kill every rank; if mpiexec is out of reach (our own
    # link is down) it may block, as may a stderr nobody reads: the timer armed first
    # makes sure this process ends.
    _exit_later(code)
    try:
        sys.stdout.flush()  # what this rank printed so far: Abort would lose it
    except BaseException:  # noqa: BLE001 -- a closed or broken stdout must not stop the abort
        pass
    dumped = _dumped or _flight_dump(message)
    try:
        message += _departures(comm)
        record = f" (flight record: {dumped})" if dumped else ""
        sys.stderr.write(f"mpidp: rank {comm.Get_rank()} of {comm.Get_size()}: {message}; "
                         f"aborting the job{record}\n")
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 -- nor a stderr that fails
        pass
    if dumped:
        time.sleep(FLIGHT_MARGIN_S)  # the other ranks write theirs (`flight`)
    # The message travels to mpiexec through this host's proxy, and the abort by
    # another channel; were the abort first, mpiexec could tear the job down with
    # the message still in the pipe. A failed job can spare half a second.
    time.sleep(MESSAGE_S)
    comm.Abort(code)
    os._exit(code)


_raised: BaseException | None = None  # the exception ending the job, for the flight record
_dumped: str | None = None  # its record, written before the traceback was printed (`_end_job`)


def _flight_dump(message: str) -> str | None:
    """Write this rank's flight record, ask the ranks on this host for theirs; its path."""
    try:
        if flight.keep() == 0:
            return None
        flight.ending = True
        path = flight.dump(message, error=_raised)
        flight.ask_peers()
        return path
    except BaseException as e:  # noqa: BLE001 -- the job must still end
        try:
            sys.stderr.write(f"mpidp: flight dump failed: {_text(e)}\n")
        except BaseException:  # noqa: BLE001
            pass
        return None


def _machinery(filename: str) -> bool:
    here = os.path.dirname(__file__)
    return (filename in (__file__, os.path.join(here, "__main__.py")) or "runpy" in filename
            or filename.endswith(os.path.join("mpi4py", "run.py")))


def _end_job(e: BaseException, what: str, comm) -> None:
    """An exception is leaving `what` on this rank: the peers would wait for it forever."""
    if isinstance(e, ExitAll) or (isinstance(e, SystemExit) and e.code in (None, 0)):
        return  # every rank exits here, or this one exits cleanly: nothing to end
    if isinstance(e, SystemExit):
        code = e.code if isinstance(e.code, int) else EXIT_ERROR
        if code % 256 == 0:  # an exit status is taken mod 256: an abort must not read as 0
            code = EXIT_ERROR
    elif isinstance(e, KeyboardInterrupt):
        code = 130
    else:
        code = EXIT_TIMEOUT if isinstance(e, TimeoutError) else EXIT_ERROR
    _exit_later(code)  # before any printing: an exception's __str__ or stderr may block
    global _raised
    _raised = e
    if isinstance(e, SystemExit):
        if isinstance(e.code, int):
            abort(f"{what} exited with status {e.code}", code, comm)
        abort(f"{what} exited: {_text(e.code)}", code, comm)  # sys.exit("message")
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C reaches every rank: no traceback needed
        abort(f"{what} interrupted", code, comm)
    tb = e.__traceback__  # from the program's own frames: skip run()'s and runpy's
    while tb is not None and tb.tb_next is not None and _machinery(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    message = f"{what} failed: {type(e).__name__}: {_text(e, 'exception')}"
    # The record first: the traceback goes to stderr through the launcher, which may be
    # slow or gone (a rank killed), and the record must not wait for it.
    global _dumped
    _dumped = _flight_dump(message)
    try:  # its __str__ may raise: traceback copes; a closed stderr it does not
        traceback.print_exception(type(e), e, tb)
    except BaseException:  # noqa: BLE001 -- an exception that cannot be printed still ends the job
        pass
    abort(message, code, comm)


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
    global _farewell
    bye = None
    if farewell:
        bye = _farewell = Farewell(MPI.COMM_WORLD)
        if flight.keep():
            flight.install()  # SIGUSR1 dumps (the main thread, before the program's)
            flight.learn_peers()
    try:
        code = main()
    except BaseException as e:  # noqa: BLE001 -- any escape must end the job, not hang it
        _end_job(e, what, comm)  # it returns for ExitAll, and exit 0, only
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
        _end_job(e, what, comm)
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
        _end_job(e, what, comm)
        raise
    finally:
        dog.stop()
