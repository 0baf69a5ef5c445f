"""The flight recorder: the last K collectives of every communicator, dumped when a job hangs.

What each communicator keeps is `mpidp.recorder`'s (its names are this module's too:
`flight.recorder`, `flight.fail`, the entry's fields); this module reads it: a
collective in flight shows its round and the peers whose messages are not complete,
read from its request when a dump is taken.

Identity, so that `mpidp.doctor` can line the ranks' records up:

- the job: ``SLURM_JOB_ID.SLURM_STEP_ID``, ``PMIX_NAMESPACE`` (Open MPI 5, PMIx
  launchers), ``OMPI_MCA_ess_base_jobid`` (Open MPI 4), else under ``python -m
  mpidp`` world rank 0's ``host:pid`` (learned at start-up, `learn_peers`: MPICH's
  Hydra sets no job variable), else None;
- a communicator: ``world``, ``self``, ``world.0`` for a duplicate, ``g<crc>#k``
  for a ``Split``'s, the same on every member and different for every
  communicator (`mpidp.commid` says how); the record holds the members, which the
  doctor checks, and for a ``Split``'s the numbers its id is made of (``parts``).

Dumps: `dump` writes this rank's record and the Python stack of every thread as
one JSON file, ``flight-rank-<world rank>.json`` in ``MPIDP_FLIGHT_DIR`` (default
``mpidp-flight`` in the working folder), atomically, through `mpidp.files` (a
temporary file of its own, then a rename; a link planted at the record's name is
replaced, never followed), and never waits for another rank. It is called on demand, by
`endjob.abort` (a deadline passed, or the program raised under ``python -m
mpidp``; the abort then waits `endjob.FLIGHT_MARGIN_S` so that the other
ranks write theirs), and on ``SIGUSR1`` (`install`): Python runs signal handlers
only when the main thread returns from MPI, so the signal's C handler wakes a
thread through ``signal.set_wakeup_fd``, and that thread dumps while the program
goes on.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
import traceback

from mpi4py import MPI

from . import commid, files, untrusted
from .recorder import (  # noqa: F401 (the recorder's names, as mpidp.flight's)
    _MULTIPLE,
    CODE,
    COMPLETE,
    DEFAULT_DIR,
    DEFAULT_K,
    DONE,
    ERROR,
    FAILED,
    LASTI,
    PERSISTENT,
    PLANNED,
    RECORD_MAX_BYTES,
    REQUEST,
    RUNNING,
    SEQ,
    SIGNED,
    STARTED,
    STATE,
    TAG,
    TIMED_OUT,
    Recorder,
    T,
    _entry,
    _live,
    _recorders,
    _state,
    _str,
    fail,
    folder,
    keep,
    site,
    skip_frames_under,
)


def recorder(base) -> Recorder | None:
    """A new communicator's recorder (None when ``MPIDP_FLIGHT=0``)."""
    k = keep()
    if k == 0:
        return None
    install()
    return Recorder(base, k)


# ------------------------------------------------------------ identity (`mpidp.commid`)

_WORLD = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()  # a dump makes no MPI call


_peers: list | None = None  # (host, pid) of every world rank, under python -m mpidp


def learn_peers(comm=None) -> None:
    """Every rank's host and pid (collective over the world, once, at start-up): a rank
    whose deadline passes asks the ranks on its host to dump too (SIGUSR1)."""
    global _peers
    _peers = (comm or MPI.COMM_WORLD).allgather((socket.gethostname(), os.getpid()))


def job_id() -> str | None:
    """What names this job on every rank alike (see the module's docstring)."""
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        if env.get(name):
            return f"{name}:{env[name]}"
    if _peers is not None:
        return "rank0:{}:{}".format(*_peers[0])
    return None


def _stacks(frames: dict) -> list[dict]:
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    return [{"name": names.get(tid, "?"), "main": tid == main, "dumping": tid == me,
             "stack": [{"file": s.filename, "line": s.lineno, "function": s.name,
                        "code": s.line or ""} for s in traceback.extract_stack(frame)]}
            for tid, frame in frames.items()]


def _exception(e: BaseException | None) -> dict | None:
    if e is None:
        return None
    return {"type": type(e).__name__, "text": _str(e),
            "stack": [{"file": s.filename, "line": s.lineno, "function": s.name,
                       "code": s.line or ""} for s in traceback.extract_tb(e.__traceback__)]}


def record(reason: str, error: BaseException | None = None) -> dict:
    """This rank's record now, as the dump holds it (`error`: the exception ending it)."""
    frames = sys._current_frames()
    comms = []
    mpi_ok = threading.current_thread() is threading.main_thread() or _MULTIPLE
    for r in list(_recorders):
        calls = list(r.calls)
        agreement = r.ident.agreement if r.ident.parent is None else None
        cid = r.comm_id if mpi_ok else r.ident.name  # (comm_id asks MPI for the numbers)
        comms.append({"id": cid, "how": r.how, "size": r.size, "rank": r.rank,
                      "members": r.members,
                      **({"parts": list(agreement.parts)} if agreement else {}),
                      "calls": [_entry(e) for e in calls]})
    return {"version": 1, "job": job_id(), "rank": _WORLD[0], "size": _WORLD[1],
            "host": socket.gethostname(), "pid": os.getpid(),
            "ppid": os.getppid(), "reason": reason,
            "time": time.time(), "keep": keep(), "comms": comms, "threads": _stacks(frames),
            "exception": _exception(error)}


def unfinished() -> list[str]:
    """The collectives started and not complete whose request the program dropped (an
    I-form never waited on, a persistent one's last Start): what MPI would leave as its
    requests pending at exit."""
    out = []
    for r in list(_recorders):
        for e in list(r.calls):
            request = e[REQUEST]
            if e[STATE] not in (PLANNED, PERSISTENT) or request is None or \
                    getattr(request, "done", True) or e[SIGNED] is None:
                continue
            file, line = site(e)
            out.append(f"{e[SIGNED].collective} #{e[SEQ]} on {r.ident.name} (called at "
                       f"{file}:{line})")
    return out


def _at_exit() -> None:
    """At a clean exit (before MPI_Finalize: atexit runs mpi4py's after this, registered
    before it), one line naming the collectives left in flight."""
    if ending or MPI.Is_finalized():
        return
    try:
        for r in list(_recorders):  # the ids' numbers that arrived: their requests done
            r.comm_id  # noqa: B018 - (the property takes them in)
        left = unfinished()
        commid.cancel_all()  # the ids' receives for numbers that never came
    except Exception:  # noqa: BLE001 - the program is ending: say nothing rather than fail
        return
    if left:
        more = f", and {len(left) - 3} more" if len(left) > 3 else ""
        verb = "was" if len(left) == 1 else "were"
        sys.stderr.write(f"mpidp: rank {_WORLD[0]} of {_WORLD[1]}: at exit, "
                         f"{'; '.join(left[:3])}{more} {verb} started and never completed "
                         f"(its request never waited on)\n")


atexit.register(_at_exit)
_dump_lock = threading.Lock()


def dump(reason: str = "on demand", where: str | None = None,
         error: BaseException | None = None) -> str:
    """Write this rank's record to ``<where or MPIDP_FLIGHT_DIR>/flight-rank-<r>.json``
    (atomically, by `mpidp.files`; a link at that name is replaced); return its path.
    Never waits for another rank; a later dump replaces an earlier one."""
    where = where or folder()
    os.makedirs(where, exist_ok=True)
    with _dump_lock:
        data = record(reason, error)
        path = os.path.join(where, f"flight-rank-{data['rank']}.json")
        # the folder may be shared (under /tmp): a link planted at the record's name is
        # replaced, not followed, and the temporary file is the writer's (mkstemp)
        files.write_json(path, data, follow=False, indent=1, default=str)
    return path


def ask_peers() -> None:
    """SIGUSR1 to the ranks on this host that have no record of their own in the folder yet
    (known only under ``python -m mpidp``): they dump where they are, computing or not. A
    record there of another job, or of another process, is not theirs (`_theirs`)."""
    if _peers is None:
        return
    host, me = socket.gethostname(), os.getpid()
    where, job = folder(), job_id()
    for rank, (h, pid) in enumerate(_peers):
        if h == host and pid != me and not _theirs(
                os.path.join(where, f"flight-rank-{rank}.json"), job, pid):
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:  # it has ended
                pass


def _theirs(path: str, job: str | None, pid: int) -> bool:
    """Is the record at `path` one that process `pid` of job `job` wrote?"""
    if not os.path.exists(path):
        return False
    try:
        rec = untrusted.read_json(path, RECORD_MAX_BYTES)
    except untrusted.InputError:  # cut off, a FIFO, a link: not a record of theirs
        return False
    return isinstance(rec, dict) and rec.get("job") == job and rec.get("pid") == pid


# ------------------------------------------------------------ SIGUSR1

_installed = False
ending = False  # set by endjob.abort: a SIGUSR1 then changes nothing


def install() -> bool:
    """Dump on SIGUSR1 (from the main thread, once; True if installed). Left alone if the
    program has its own SIGUSR1 handler or wakeup fd."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return _installed
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return False
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    try:
        old = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
    except ValueError:
        return False
    if old != -1:  # someone's (asyncio's): theirs, not ours
        signal.set_wakeup_fd(old)
        return False
    signal.signal(signal.SIGUSR1, lambda *_: None)  # the work is the thread's
    _installed = True
    threading.Thread(target=_listen, args=(ours, theirs), name="mpidp-flight",
                     daemon=True).start()
    return True


def _listen(ours: socket.socket, theirs: socket.socket) -> None:
    while True:
        data = ours.recv(64)
        if signal.SIGUSR1 in data and not ending:
            try:
                dump("SIGUSR1")
            except Exception as e:  # noqa: BLE001 - the program goes on
                sys.stderr.write(f"mpidp: flight dump failed: {e}\n")
