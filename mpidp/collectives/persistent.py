"""Persistent collectives (MPI-4's ``MPI_Allreduce_init`` ...): planned once, started many times.

    req = mpidp.allreduce_init(comm, x, y)      # checks, algorithm, blocks, scratch, tag
                                                # (`api`: the plan, kept in a Persistent)
    for step in range(steps):
        req.Start()                             # posts the first round; nothing else to do
        ...                                     # req.Test() between other work
        req.Wait()
    req.Free()                                  # scratch and tag back

A persistent collective takes its number of the communicator's sequence when it
is created and keeps it, with its tag, until `Free`: starting it never moves the
sequence, and its tags lie in a range of their own (`state`), so a collective
started later with the same slot never meets it. Every rank must create its
persistent collectives in the same order, as MPI requires.

The first start runs the algorithm's generator and, where it is safe (NumPy
buffers, a real MPI communicator, an algorithm that writes only by receives and
its op: `replay.replayable`), records its rounds and reductions; every later start
replays them with MPI persistent requests (`replay.Replay`): per round a
``Startall``, its completion, the recorded reductions. Elsewhere each start runs
the generator again.
"""

from __future__ import annotations

from .. import flight
from .engine.driver import Request
from .engine.replay import Replay, recording, replayable
from .plan import Plan


class Persistent:
    """A collective planned once and started any number of times (MPI-4's ``*_init``).

    Creating it does everything a call does before its first message: the checks,
    the algorithm, the blocks, the scratch, the tag (its number of the sequence,
    kept for life, so starting it never moves the sequence). `Start` posts the
    first round; `Test`/`Wait` as an `mpidp.Request`; `Free` gives the scratch and
    the tag back. Like MPI's persistent requests, a completed or never started one
    is inactive: `Wait` returns at once and `Test` answers True. From the second
    start on, a replayable plan is replayed (`replay`): ``request`` is then the
    same `Replay` at every start. A start whose own work raises (a reduction)
    fails: its `Wait` raises, again at every later `Wait`, and it is no longer
    active, so it may be started again (a run recorded part way is recorded anew)
    or freed; its slot stays held until `Free`, as any persistent collective's.
    """

    __slots__ = ("plan", "request", "freed", "log", "replay")

    def __init__(self, plan: Plan):
        self.plan, self.request, self.freed = plan, None, False
        self.log = [] if replayable(plan) else None  # what the first run does, recorded
        self.replay: Replay | None = None

    def Start(self) -> None:  # noqa: N802
        if self.freed:
            raise RuntimeError("Start of a freed persistent collective")
        r = self.request
        if r is not None and not r.done and r.error is None:  # `_in_flight`
            raise RuntimeError("Start of a persistent collective that is still active: "
                               "complete it (Wait) first")
        if r is not None and r is self.replay:  # a replayed start (kept short: most are)
            r.start()
            return
        p = self.plan
        if self.log is not None and r is not None:
            if r.error is None:  # the recorded run is complete: replayed from now on
                self.replay, self.log = Replay(p.call.comm, p.tag, self.log, p.finish), None
                entry = p.call.entry  # the flight record reads every start's state from it
                if entry is not None:  # (the id's numbers went out at the first start)
                    entry[flight.REQUEST] = self.replay
            else:  # it raised part way: record the next run instead
                self.log = []
        if self.replay is not None:
            self.request = self.replay
            self.replay.start()
            return
        rounds = p.algo(*p.args) if self.log is None else recording(p, self.log)
        self.request = Request(p.call.comm, rounds, p.tag, p.finish, p.stager)
        self._record()

    def _record(self) -> None:
        """The flight recorder's entry of this collective reads this start's request."""
        entry = self.plan.call.entry
        if entry is not None:
            entry[flight.REQUEST] = self.request
            self.plan.call.state.flight.started()

    @staticmethod
    def Startall(requests) -> None:  # noqa: N802
        for r in requests:
            r.Start()

    def test(self) -> bool:
        return self.request is None or self.request.test()

    def wait(self, timeout: float | None = None) -> None:
        if self.request is not None:
            self.request.wait(timeout)

    def Test(self, status=None) -> bool:  # noqa: N802
        return self.request is None or self.request.Test()

    def Wait(self, status=None) -> bool:  # noqa: N802
        return self.request is None or self.request.Wait()

    def __bool__(self) -> bool:
        """Active: started, and not yet reported complete (Waitany and the like skip it)."""
        return self.request is not None and bool(self.request)

    def _in_flight(self) -> bool:
        """Started, and neither complete nor failed (a run whose own work raised has no
        message in flight: it may be started again, or freed)."""
        r = self.request
        return r is not None and not r.done and r.error is None

    def Free(self) -> None:  # noqa: N802
        """Give the scratch and the tag back; only when it is not active."""
        if self._in_flight():
            raise RuntimeError("Free of a persistent collective that is still active")
        if not self.freed:
            if self.replay is not None:
                self.replay.free()
            self.plan.free()
            self.freed = True

    @property
    def done(self) -> bool:
        return self.request is None or self.request.done

    def __repr__(self) -> str:
        state = "inactive" if self.done else "active"
        return f"<mpidp persistent collective, {state}>"
