"""Replay: a persistent collective's first run recorded, and every later start replayed.

A schedule does not depend on the data: which views go to which peer in which
round, and which reductions follow each round, are fixed by the plan (counts,
rank, size, algorithm, placement, the plan's own buffers and scratch). So the
first `Start` of a persistent collective runs the algorithm's generator for real,
on real data, and records what it did; every later start replays the record:

    first start (recorded)                      later starts (replayed)
    ----------------------                      -----------------------
    generator yields round k: [Send, Recv]      MPI.Prequest.Startall(round k's requests)
    driver posts Isend/Irecv, tests them        Testall / Waitall of them
    generator resumes: op(acc, tmp, src) ...    ufunc(src, tmp, out=acc) ... as recorded

What is recorded, in the order it happened: each round's messages (view, peer,
send or receive), made once into MPI persistent requests (``comm.Recv_init`` /
``comm.Send_init``, the plan's tag, receives first as `driver.post` posts
them); and every reduction, through a `Recorder` that stands for the plan's
`Op`: ``op(acc, tmp, src)`` as ``ufunc(src or acc, tmp, out=acc)`` and
``op.finish(block, n)`` as the division it does (AVG only). Both are still
executed while recording. A start then does the reductions recorded before the
first round, and per round: start its requests, complete them (`test` round by
round, never blocking; `wait`), do the reductions that followed it; the plan's
`finish` at the end.

Why it is safe, and only where `replayable` says so:

- the buffers are NumPy arrays with no staging (the plan's stager is None): a view
  recorded once is the same memory at every start, and no device copy is skipped;
- the communicator is a real ``MPI.Comm``: a comm-like (`CountingComm`, the
  simulator's) keeps the generator, so that it still sees every message;
- the algorithm writes the buffers only by receives and through `op` (the registry's
  ``replayable``). A direct write would not be recorded: `naive_allreduce` out of
  place (``buf[...] = src``), `direct_allreduce` (its own vector into the scratch) and
  `rounds.copy_rounds` (a copy before the rounds) keep the generator.

Cost per start: the α of the rounds and the reductions, without the generator,
the round lists and the per-message ``Isend``/``Irecv`` calls.
"""

from __future__ import annotations

import threading
import time
from functools import cache

import numpy as np
from mpi4py import MPI

from ..algorithms.ops import Op, Wrapper
from ..algorithms.rounds import Recv, Rounds, Send, no_rounds
from .completion import Polled
from .staging import msg

_startall, _now = MPI.Prequest.Startall, time.perf_counter  # (every start's path)


def replayable(plan) -> bool:
    """True if the runs of `plan` (a `plan.Plan`: its comm, registered algorithm, source
    buffer and stager) may be recorded once and replayed (see the module docstring)."""
    if plan.stager is not None or not isinstance(plan.call.comm, MPI.Comm):
        return False
    if plan.algo is no_rounds:
        return True
    found = plan.algorithm
    if found is None or not found.replayable:  # the call path's own rounds, or it copies
        return False
    return found.replayable is True or plan.src is None  # "in place" only


class Recorder(Wrapper):
    """The plan's `Op` while recording: does each reduction and logs it as ``f(a, b, out=c)``."""

    __slots__ = ("log",)

    def __init__(self, op: Op, log: list):
        self.op, self.log = op, log

    def __call__(self, acc, tmp, src=None) -> None:
        self.op(acc, tmp, src)
        a, f = acc if src is None else src, self.op.np_ufunc
        if acc.size == 1 and np.may_share_memory(a, acc):  # as `Op.apply` does, decided once
            f = _apart(f)
        self.log.append((f, a, tmp, acc))

    def finish(self, block, n: int) -> None:
        self.op.finish(block, n)
        if self.op.divide and n > 1:  # what Op.finish does; nothing else to record
            self.log.append((np.true_divide, block, n, block))


@cache
def _apart(ufunc):
    """``ufunc(a, b, out=a)`` on one item, computed apart and copied (`Op.apply`: NumPy
    runs it as a reduction, the operands the other way round)."""
    def one_item(a, b, out) -> None:
        out[...] = ufunc(a, b)
    return one_item


def recording(plan, log: list) -> Rounds:
    """The plan's rounds, each logged as it is yielded, its `Op` replaced by a `Recorder`."""
    args = tuple(Recorder(a, log) if isinstance(a, Op) else a for a in plan.args)
    for round_ in plan.algo(*args):
        log.append(round_)
        yield round_


class Replay(Polled):
    """A recorded run, started again and again: a request, as a `driver.Request` is.

    Both are `completion.Polled` (the same test, wait, Test and Wait); here a round
    is the recorded persistent requests, and what follows it the recorded reductions.

    Args:
        comm, tag: where the messages go (the persistent collective's tag).
        log: what `recording` logged: rounds (lists) and reductions (tuples), in order.
        finish: the plan's, called when a start completes (or None).
    """

    __slots__ = ("pre", "steps", "finish", "_lock", "_step", "_reqs", "_active", "done",
                 "error", "rounds", "completed_at")

    def __init__(self, comm, tag: int, log: list, finish=None):
        self.pre: list = []  # the reductions before the first round
        self.steps: list = []  # per round: (its persistent requests, the reductions after it)
        reductions = self.pre
        for entry in log:
            if type(entry) is list:
                reqs = [comm.Recv_init(msg(m.buf), m.peer, tag) for m in entry if type(m) is Recv]
                reqs += [comm.Send_init(msg(m.buf), m.peer, tag) for m in entry
                         if type(m) is Send]
                reductions = []
                self.steps.append((reqs, reductions))
            else:
                reductions.append(entry)
        self.finish, self._lock = finish, threading.Lock()
        self._step, self._reqs = 0, ()  # the round in flight, and its requests
        self._active, self.done = False, True  # inactive until started
        self.error = None  # what a reduction of the current start raised (as a `Request`'s)
        self.rounds, self.completed_at = 0, None

    def start(self) -> None:
        """Do the reductions before the first round and start it (never blocks)."""
        lock = self._lock  # held: a progress thread may be testing it (`Polled.wait`'s way)
        lock.acquire()
        try:
            self.done, self._active, self._step, self.rounds, self.error = \
                False, True, -1, 0, None
            if self.pre:
                self._reduce(self.pre)
            self._next()
        finally:
            lock.release()

    def _reduce(self, reductions: list) -> None:
        """Do recorded reductions; if one raises, this start has failed (as a `Request`'s
        own work raising): no message is in flight, and it never completes."""
        try:
            for f, a, b, out in reductions:
                f(a, b, out=out)
        except BaseException as exc:
            self.error, self._reqs = exc, ()
            raise

    def _next(self) -> None:
        """Start the next round, or complete."""
        step = self._step = self._step + 1
        if step < len(self.steps):
            self.rounds += 1
            reqs = self._reqs = self.steps[step][0]
            if reqs:
                _startall(reqs)
            return
        self._reqs = ()
        self.done, self.completed_at = True, _now()
        if self.finish is not None:
            self.finish()

    def _advance(self) -> None:
        """The round is complete: its reductions, then the next round."""
        if self.error is not None:
            self._check_failed()  # raises
        reductions = self.steps[self._step][1]
        if reductions:
            self._reduce(reductions)
        self._next()

    def free(self) -> None:
        """Free the MPI persistent requests (only when not active)."""
        for reqs, _ in self.steps:
            for r in reqs:
                r.Free()
        self.steps, self._reqs = [], ()

    def __repr__(self) -> str:
        return f"<mpidp replay {'done' if self.done else 'pending'}, {len(self.steps)} rounds>"
