"""The flight recorder: the last K collectives of every communicator, dumped when a job hangs.

Each communicator's state (`collectives.state`) keeps a `Recorder`: the last
``MPIDP_FLIGHT`` collectives (default 64, 0: off), each an entry (a list) holding its
number in the communicator's sequence, the collective and its signature's
fields (counts, dtype, op, algorithm, root), its tag, the call site in the
user's code (the first frame outside mpidp), the time it was called, and its
state: ``planned`` (arguments checked), ``started`` (its rounds are running),
``complete``, or ``failed`` (with the exception). Nothing per round is recorded:
what a collective in flight is doing (its round, the peers whose messages are
not complete) is read from the live request, or from the frame of the blocking
driver, when a dump is taken.

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
`watchdog.abort` (a deadline passed, or the program raised under ``python -m
mpidp``; the abort then waits `watchdog.FLIGHT_MARGIN_S` so that the other
ranks write theirs), and on ``SIGUSR1`` (`install`): Python runs signal handlers
only when the main thread returns from MPI, so the signal's C handler wakes a
thread through ``signal.set_wakeup_fd``, and that thread dumps while the program
goes on.
"""

from __future__ import annotations

import atexit
import collections
import os
import signal
import socket
import sys
import threading
import time
import traceback
import weakref

from mpi4py import MPI

from . import commid, config, files, untrusted

DEFAULT_K = 64
DEFAULT_DIR = "mpidp-flight"
RECORD_MAX_BYTES = 256 << 20  # what `ask_peers` reads of a record (the doctor's bound too)
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # frames in mpidp are not call sites
_NOT_SITES = (_HERE,)  # folders whose frames are never call sites (`skip_frames_under`)


def skip_frames_under(folder: str) -> None:
    """Frames of code under `folder` are not call sites either: the site is the first frame
    outside mpidp and outside it (mpidp.torch passes torch.distributed's folder, so a
    dump names the user's ``dist.all_reduce`` line, not torch's own)."""
    global _NOT_SITES
    folder = os.path.join(os.path.abspath(folder), "")
    if folder not in _NOT_SITES:
        _NOT_SITES = (*_NOT_SITES, folder)

PLANNED, STARTED, COMPLETE, FAILED = "planned", "started", "complete", "failed"
TIMED_OUT = "timed out"  # its wait's deadline passed: still in flight, as far as peers know
PERSISTENT = "persistent"  # a *_init collective: in flight while its last Start's request is


def keep() -> int:
    """Collectives kept per communicator (``MPIDP_FLIGHT``; 0: the recorder is off)."""
    k = config.get("MPIDP_FLIGHT")
    return DEFAULT_K if k is None else k


def folder() -> str:
    """Where the dumps go (``MPIDP_FLIGHT_DIR``, or ``mpidp-flight`` here)."""
    return config.get("MPIDP_FLIGHT_DIR") or DEFAULT_DIR


# An entry is a list, not an object: it is made on every call's path, and a list of
# ten costs a fifth of what an instance's __init__ does (0.1 us against 0.5 us). The
# call site is kept as the frame's code object and its instruction offset (`site`
# makes file:line of them when a dump is taken): a frame's f_lineno searches the
# code's line table.
SEQ, CODE, LASTI, T, STATE, SIGNED, TAG, ERROR, REQUEST, RUNNING = range(10)
# RUNNING: what the blocking driver (`engine.driver.run`) hands over while a blocking call
# runs: its `Request` under a deadline, else (rounds done, the round in flight); None after
_time = time.time
_getframe = sys._getframe
# where the last call site was: the depth above Recorder.add of the frame below it
# (mpidp's), the site's code and that frame's, checked by identity (`Recorder.add`),
# found by `_walk`
_last = (3, None, None)


def _walk():
    """The first frame outside mpidp above `Recorder.add`, remembered in `_last`."""
    global _last
    depth, below = 2, _getframe(2)  # (Recorder.add's caller's caller: an entry point)
    f = below.f_back
    while f.f_back is not None and f.f_code.co_filename.startswith(_NOT_SITES):
        below, f, depth = f, f.f_back, depth + 1
    _last = (depth - 1, f.f_code, below.f_code)
    return f


def site(entry: list) -> tuple[str, int | None]:
    """(file, line) of the call site an entry holds."""
    code, lasti = entry[CODE], entry[LASTI]
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return code.co_filename, line
    return code.co_filename, code.co_firstlineno


def fail(entry: list, e: BaseException) -> None:
    """The call of `entry` raised `e`. A deadline's TimeoutError leaves it in flight: the
    request the blocking driver handed over (`RUNNING`) is kept for the dump to read its
    round."""
    entry[STATE], entry[ERROR] = FAILED, f"{type(e).__name__}: {_str(e)}"
    if isinstance(e, TimeoutError):
        entry[STATE] = TIMED_OUT
        if entry[REQUEST] is None and not isinstance(entry[RUNNING], tuple):
            entry[REQUEST] = entry[RUNNING]


class Recorder:
    """A communicator's last K collectives (`add` is on every call's path: kept cheap)."""

    __slots__ = ("ident", "agreeing", "how", "size", "rank", "members", "calls", "append",
                 "__weakref__")

    def __init__(self, base, k: int):
        self.calls: collections.deque = collections.deque(maxlen=k)
        self.append = self.calls.append  # (bound once: `add` is on every call's path)
        self.ident, self.how, self.members = commid.identify(base)
        self.agreeing = self.ident.agreement  # (None once its numbers are all in)
        try:
            self.size, self.rank = base.Get_size(), base.Get_rank()
        except Exception:  # noqa: BLE001 - a comm-like object
            self.size = self.rank = None
        _recorders.add(self)

    def started(self) -> None:
        """A collective on this communicator starts: its id's numbers go out (`commid`)."""
        if self.agreeing is not None:
            self.agreeing.post()

    @property
    def comm_id(self) -> str:
        """The communicator's id (`mpidp.commid`), as far as its members agree on it yet."""
        if self.agreeing is not None and self.agreeing.progress():
            self.agreeing = None
        return self.ident.name

    def add(self, seq) -> list:
        """Record a call numbered `seq`, made from the first frame outside mpidp: the
        entry [seq, code, offset, time, state, signed, tag, error, request, running].

        Walking up frame by frame makes a frame object of each (`_walk`); most calls
        come the way the last one did, so the frame where the last site was is tried
        first: it is the site if its code and the code of the frame below are the
        last site's (then the one below is mpidp's, and the site is not)."""
        depth, code, below_code = _last
        try:
            below = _getframe(depth)
        except ValueError:  # not that many frames
            below = None
        f = None if below is None else below.f_back
        if f is None or f.f_code is not code or below.f_code is not below_code:
            f = _walk()
            code = f.f_code
        entry = [seq, code, f.f_lasti, _time(), PLANNED, None, None, None, None, None]
        self.append(entry)
        if self.agreeing is not None and self.agreeing.progress():  # the id's numbers in
            self.agreeing = None
        return entry


_recorders: weakref.WeakSet = weakref.WeakSet()


def recorder(base) -> Recorder | None:
    """A new communicator's recorder (None when ``MPIDP_FLIGHT=0``)."""
    k = keep()
    if k == 0:
        return None
    install()
    return Recorder(base, k)


# ------------------------------------------------------------ identity (`mpidp.commid`)

# another thread (SIGUSR1's) asks MPI about requests only where MPI allows it
_MULTIPLE = MPI.Query_thread() == MPI.THREAD_MULTIPLE
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


# ------------------------------------------------------------ what a collective is doing now

def _round_of(request) -> dict:
    """The round a live `driver.Request` is in, and which of its messages are pending."""
    out = {"round": request.rounds, "done": request.done}
    if request.done:
        return out
    round_ = getattr(request, "_round", None)
    if not (threading.current_thread() is threading.main_thread() or _MULTIPLE) or \
            not request._lock.acquire(timeout=0.2):  # a round's reduction in progress
        out["pending"] = _peers_of(round_, None)
        return out
    try:
        reqs = list(request._reqs)
        flags = [bool(r.Get_status()) for r in reqs]  # never frees a request, unlike Test
    finally:
        request._lock.release()
    out["pending"] = _peers_of(round_, flags)
    return out


def _peers_of(round_, flags) -> list[dict]:
    """Messages of `round_` not known complete (posted receives first, as `driver.post`)."""
    if not round_:
        return []
    msgs = [m for m in round_ if not m.outgoing] + [m for m in round_ if m.outgoing]
    return [{"peer": int(m.peer), "kind": "send" if m.outgoing else "recv",
             "known": flags is not None}
            for i, m in enumerate(msgs) if flags is None or i >= len(flags) or not flags[i]]


def _live(entry: list) -> dict:
    request = entry[REQUEST]
    if request is not None and hasattr(request, "_lock"):
        return _round_of(request)
    running = entry[RUNNING]  # a blocking call's, handed over by the driver
    if isinstance(running, tuple):
        count, round_ = running
        return {"round": count + 1, "done": False, "pending": _peers_of(round_, None)}
    if running is not None:
        return _round_of(running)
    return {}


def _entry(e: list) -> dict:
    file, line = site(e)
    d = {"seq": e[SEQ], "tag": e[TAG], "state": e[STATE], "file": file, "line": line,
         "site": f"{file}:{line}", "t": e[T],
         # an I-form's (and a persistent one's) entry holds its request from the start; a
         # blocking call's only once its deadline passed (`fail`, from the driver's frame)
         "blocking": e[REQUEST] is None or e[STATE] == TIMED_OUT}
    if e[SIGNED] is not None:
        d["collective"] = e[SIGNED].collective
        d.update({k: (list(v) if isinstance(v, tuple) else str(v) if k == "dtype" else v)
                  for k, v in e[SIGNED].description.items()})
    if e[STATE] == PERSISTENT:  # one entry for every start: the last one's state
        req = e[REQUEST]
        d["state"] = PERSISTENT if req is None or req.done else STARTED
    failed = getattr(e[REQUEST], "error", None)  # the I-form's own work raised as it ran
    if failed is not None and e[ERROR] is None:
        d["state"], d["error"] = FAILED, f"{type(failed).__name__}: {_str(failed)}"
    if e[ERROR] is not None:
        d["error"] = e[ERROR]
    if d["state"] in (PLANNED, STARTED, TIMED_OUT):
        d.update(_live(e))
    return d


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


def _str(e) -> str:
    try:
        return str(e)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ fails
        return "<str() failed>"


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
            if e[STATE] not in (STARTED, PERSISTENT) or request is None or \
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
ending = False  # set by watchdog.abort: a SIGUSR1 then changes nothing


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
