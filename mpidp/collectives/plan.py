"""A collective's place in its communicator's sequence, and the plan that runs it.

Every entry point (`api`'s functions, `mpidp.Comm`) goes through the same two steps:

    Call(comm)   take the next slot of the comm's tag sequence, first of all
    Plan(...)    the checked arguments as rounds (a generator), with the call's tag;
                 `run()` blocks, `start()` returns a `schedule.Request`

and the slot goes back when the collective completes, or at once if planning
raises (the number stays used up, on this rank as on the others).
"""

from __future__ import annotations

from .buffers import stager
from .checks import agree, debug_enabled
from .ops import Op
from .schedule import Request, run
from .state import CommState, check_user_tag, signature, state


class Call:
    """One collective's place in its communicator's sequence: a slot now, a tag once planned.

    The slot is taken first, so a call that raises has used its number up on this
    rank as on the others; `end` gives the slot back when the collective is done.
    """

    __slots__ = ("comm", "state", "slot", "user_tag", "debug")

    def __init__(self, comm, tag: int | None, debug: bool):
        self.comm, self.debug = comm, debug
        self.state: CommState = state(comm)
        self.user_tag = None if tag is None else check_user_tag(tag)
        self.slot = None if tag is not None else self.state.take()

    def tag(self, collective: str, count, dtype, op: Op | None, algorithm: str,
            root: int | None = None) -> int:
        """The tag for this call; with debug on, the ranks first agree on its arguments.

        `count` is the count, or the tuple of per-rank counts, that every rank passes
        alike; the signature folded into the tag is made of exactly these fields.
        """
        if debug_enabled(self.debug):
            call = {"count": count, "dtype": dtype, "op": op and op.name,
                    "algorithm": algorithm, "root": root}
            agree(self.comm, collective, self.user_tag if self.slot is None
                  else self.state.tag(self.slot), **{k: v for k, v in call.items()
                                                      if v is not None})
        if self.slot is None:
            return self.user_tag
        return self.state.tag(self.slot, signature(collective, count, dtype,
                                                   op and op.name, algorithm, root))

    def end(self) -> None:
        if self.slot is not None:
            self.state.release(self.slot)
            self.slot = None


class Plan:
    """A collective ready to run: its rounds, and what to do when they are done.

    `buf` (the buffer the rounds work on) decides, once, whether rounds need a
    `buffers.Stager` (device buffers) or nothing (NumPy).
    """

    __slots__ = ("call", "rounds", "tag", "on_done", "stager")

    def __init__(self, call: Call, rounds, tag: int, on_done=None, buf=None):
        self.call, self.rounds, self.tag, self.on_done = call, rounds, tag, on_done
        self.stager = None if buf is None else stager(buf, call.state.pool)

    def finish(self) -> None:
        if self.on_done is not None:
            self.on_done()
        self.call.end()

    def start(self) -> Request:
        return Request(self.call.comm, self.rounds, self.tag, self.finish, self.stager)

    def run(self) -> None:
        run(self.call.comm, self.rounds, self.tag, self.finish, self.stager)


def in_sequence(comm, tag: int | None, debug: bool, body, *args, **kwargs):
    """``body(call, *args, **kwargs)`` for a new `Call`; its slot goes back if body raises."""
    call = Call(comm, tag, debug)
    try:
        return body(call, *args, **kwargs)
    except BaseException:
        call.end()
        raise


def planned(body):
    """``plan_*(comm, ..., tag=None, debug=False)`` from a body that takes a `Call` first."""

    def plan(comm, *args, tag: int | None = None, debug: bool = False, **kwargs) -> Plan:
        return in_sequence(comm, tag, debug, body, *args, **kwargs)

    plan.__name__, plan.__doc__, plan.body = body.__name__, body.__doc__, body
    return plan
