"""Ending the job: one rank's failure becomes every rank's, with one line that says why.

When a rank raises, or its deadline passes, its peers would wait for it forever:

- `end_job(e, what)` turns an exception leaving `what` into an exit code (124 for a
  `TimeoutError`, 130 for Ctrl-C, the program's own for ``sys.exit(n)``), writes this
  rank's flight record first (`mpidp.flight`), prints the traceback from the program's
  own frames, then calls `abort`;
- `abort(message)` prints one line naming the rank (and the ranks whose program had
  already ended, from the launcher's `Farewell`), waits for the other ranks to write
  their flight records, then calls ``MPI_Abort``. A timer armed first ends this process
  even if ``MPI_Abort``, a stderr nobody reads, or an exception's ``__str__`` blocks.

`mpidp.watchdog` calls these: its `run` for an entry point, its `guard` for a block.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from mpi4py import MPI

from . import flight
from .farewell import Farewell

EXIT_TIMEOUT = 124  # the code `timeout(1)` uses
EXIT_ERROR = 1
ABORT_GRACE_S = 5.0  # if Abort itself cannot finish (mpiexec out of reach), exit anyway
MESSAGE_S = 0.5  # between the message and Abort: time for mpiexec to forward the message
# After its flight record is written (mpidp.flight), a rank waits this long before the
# abort: the other ranks' deadlines pass at about the same time, and the abort ends them,
# so it leaves them the time to write theirs (a few ms each, more under load).
FLIGHT_MARGIN_S = 2.0


class ExitAll(SystemExit):
    """Every rank raises this at the same point (after agreeing): exit, no Abort needed."""


farewell: Farewell | None = None  # the launcher's, if this process runs under it (`watchdog.run`)


def _departures(comm) -> str:
    """'; rank 1 had already left (...)' for the ranks whose program ended, or ''."""
    if farewell is None:
        return ""
    world = MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT)
    who = "rank" if world else "world rank"  # the goodbyes are numbered in the world
    return "".join(f"; {who} {r} had already left (its program ended with status {code})"
                   for r, code in sorted(farewell.left().items()))


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


def end_job(e: BaseException, what: str, comm) -> None:
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
