"""A bound on one resume of a generator: an endless loop without ``yield`` is stopped.

The engine cannot stop a generator that never yields: ``next(gen)`` does not
return, so no check in the engine's loop ever runs. Under MPI the same schedule
is a hang. Here a watchdog thread looks at every running simulation a few times
per second; when one rank's generator has been running for longer than the
simulation's timeout, in the same step (one resume, not a slow run of many), it
raises `Overran` inside the simulating thread, and the engine turns that into a
`ScheduleError` naming the rank and its round.

How: CPython's ``PyThreadState_SetAsyncExc``, which makes an exception arrive in
another thread between two bytecodes, so it interrupts any loop of Python code;
it is what a signal handler would do, without taking SIGALRM (which
pytest-timeout and the user may own) and not only on the main thread. The
engine's loop pays nothing for it: the watchdog reads the step the engine is in
and which generator is running (``gi_running``) from outside. What it cannot
interrupt is one long call into C (a ``time.sleep(1e9)``, a blocking read): the
exception arrives when that call returns. Where ``ctypes.pythonapi`` is missing
(not CPython), there is no bound.
"""

from __future__ import annotations

import threading
import time

try:
    import ctypes

    _set_async_exc = ctypes.pythonapi["PyThreadState_SetAsyncExc"]  # (thread, exception)
    _set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
    _clear_async_exc = ctypes.pythonapi["PyThreadState_SetAsyncExc"]  # (thread, NULL)
    _clear_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
except (ImportError, AttributeError):  # not CPython: no bound
    _set_async_exc = None


class Overran(BaseException):
    """Raised inside a generator that ran past its timeout without yielding.

    A BaseException, so that an algorithm's ``except Exception`` does not swallow it.
    """

    def __str__(self) -> str:
        return "a generator ran past its timeout without yielding (mpidp.sim)"


class Watch:
    """One simulation as the watchdog sees it: the engine updates `step`."""

    __slots__ = ("thread", "gens", "timeout", "step", "seen", "since", "fired")

    def __init__(self, gens: list, timeout: float):
        self.thread, self.gens, self.timeout = threading.get_ident(), gens, timeout
        self.step = 0
        self.seen: tuple | None = None  # (step, rank) of the resume running at the last look
        self.since = 0.0  # when that resume was first seen
        self.fired = False


_lock = threading.Condition()
_watched: dict[int, Watch] = {}  # id(watch) -> watch
_thread: threading.Thread | None = None


def start(gens: list, timeout: float | None) -> Watch | None:
    """Watch the generators of one simulation (None: no timeout, or no way to enforce one)."""
    global _thread
    if timeout is None or _set_async_exc is None:
        return None
    watch = Watch(gens, timeout)
    with _lock:
        _watched[id(watch)] = watch
        if _thread is None:
            _thread = threading.Thread(target=_loop, name="mpidp.sim deadline", daemon=True)
            _thread.start()
        _lock.notify()
    return watch


def stop(watch: Watch | None) -> None:
    """The simulation is over: forget it, and cancel a stop that has not arrived yet."""
    if watch is None:
        return
    with _lock:
        del _watched[id(watch)]
        if watch.fired:  # raised but maybe not delivered: it must not land after the run
            _clear_async_exc(watch.thread, None)


def _loop() -> None:
    while True:
        with _lock:
            while not _watched:
                _lock.wait()
            tick = min(w.timeout for w in _watched.values()) / 4
            now = time.monotonic()
            for w in _watched.values():
                _look(w, now)
        time.sleep(min(max(tick, 0.01), 0.5))


def _look(w: Watch, now: float) -> None:
    """Stop `w`'s thread if the same resume has run for longer than its timeout."""
    rank = next((r for r, g in enumerate(w.gens) if getattr(g, "gi_running", False)), None)
    seen = None if rank is None else (w.step, rank)
    if seen is None or seen != w.seen:
        w.seen, w.since = seen, now
    elif now - w.since >= w.timeout and not w.fired:
        w.fired = True
        _set_async_exc(w.thread, Overran)
