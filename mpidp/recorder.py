"""What the flight recorder keeps: the last K collectives of every communicator.

Each communicator's state (`collectives.state`) keeps a `Recorder`: the last
``MPIDP_FLIGHT`` collectives (default 64, 0: off), each an entry (a list) holding its
number in the communicator's sequence, the collective and its signature's
fields (counts, dtype, op, algorithm, root), its tag, the call site in the
user's code (the first frame outside mpidp), the time it was called, and its
state: ``planned`` (arguments checked), ``started`` (its rounds are running),
``complete``, or ``failed`` (with the exception). Nothing per round is recorded:
what a collective in flight is doing (its round, the peers whose messages are
not complete) is read from its request when a dump is taken (`mpidp.flight`); a
blocking call's request, or its round, is handed to the entry by the driver
(`RUNNING`), then `DONE` once its rounds have run.

Only what is not known otherwise is stored on the call's path: ``started`` and
``complete`` are derived when a dump is taken (`_state`), from what the entry
already holds: an I-form's request (started; complete once it is done), a blocking
call's `RUNNING` (started while it holds a round or a request, complete at `DONE`).
What is stored is ``failed`` and ``timed out`` (`fail`), a persistent collective's
``persistent`` and, once it is freed, ``complete``.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import weakref

from mpi4py import MPI

from . import commid, config

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
DONE = "done"  # a blocking call's RUNNING once its rounds have run: its entry reads complete
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
# eleven costs a fifth of what an instance's __init__ does (0.1 us against 0.5 us). The
# call site is kept as the frame's code object and its instruction offset (`site`
# makes file:line of them when a dump is taken): a frame's f_lineno searches the
# code's line table.
SEQ, CODE, LASTI, T, STATE, SIGNED, TAG, ERROR, REQUEST, RUNNING, WHAT = range(11)
# RUNNING: what the blocking driver (`engine.driver.run`) hands over while a blocking call
# runs: its `Request` under a deadline, else (rounds done, the round in flight); DONE once
# its rounds have run, None if they raised
# WHAT: the call as its caller names it (`name_call`: "DDP bucket 3"), None as a rule
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
        if entry[REQUEST] is None and hasattr(entry[RUNNING], "_lock"):  # the Request
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

    def add(self, seq, signed=None, tag=None) -> list:
        """Record a call numbered `seq`, made from the first frame outside mpidp: the
        entry [seq, code, offset, time, state, signed, tag, error, request, running, what]
        (`signed` and `tag` where the call knows them already, else stored once planned).

        Walking up frame by frame makes a frame object of each (`_walk`); most calls
        come the way the last one did, so the frame where the last site was is tried
        first: it is the site if its code and the code of the frame below are the
        last site's (then the one below is mpidp's, and the site is not)."""
        depth, code, below_code = _last
        try:
            below = _getframe(depth)
            f = below.f_back
            if f.f_code is not code or below.f_code is not below_code:
                f = _walk()
                code = f.f_code
        except (ValueError, AttributeError):  # not that many frames (f_back None)
            f = _walk()
            code = f.f_code
        entry = [seq, code, f.f_lasti, _time(), PLANNED, signed, tag, None, None, None, None]
        self.append(entry)
        if self.agreeing is not None and self.agreeing.progress():  # the id's numbers in
            self.agreeing = None
        return entry


_recorders: weakref.WeakSet = weakref.WeakSet()


def name_call(recorder: Recorder | None, request, what: str) -> None:
    """Name the call that returned `request` (an I-form's) as its caller knows it: a dump
    gives its site as ``file:line (what)``. mpidp.torch names DDP's bucket reductions so,
    whose site in the user's code is only the line of ``loss.backward()``."""
    if recorder is None:
        return
    for entry in reversed(recorder.calls):  # its own call is the last, or nearly
        if entry[REQUEST] is request:
            entry[WHAT] = what
            return


def _str(e) -> str:
    try:
        return str(e)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ fails
        return "<str() failed>"


# ------------------------------------------------ an entry as a dump holds it: what it is doing now

# another thread (SIGUSR1's) asks MPI about requests only where MPI allows it
_MULTIPLE = MPI.Query_thread() == MPI.THREAD_MULTIPLE

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


def _state(e: list) -> str:
    """An entry's state: as stored, or (stored ``planned``) derived from what it holds."""
    state = e[STATE]
    if state != PLANNED:
        return state
    running, request = e[RUNNING], e[REQUEST]
    if running is DONE or (request is not None and request.done):
        return COMPLETE
    return PLANNED if running is None and request is None else STARTED


def _entry(e: list) -> dict:
    file, line = site(e)
    d = {"seq": e[SEQ], "tag": e[TAG], "state": _state(e), "file": file, "line": line,
         "site": f"{file}:{line}" if e[WHAT] is None else f"{file}:{line} ({e[WHAT]})",
         "t": e[T],
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
