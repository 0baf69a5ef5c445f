"""A collective's place in its communicator's sequence, and the plan that runs it.

Every entry point (`api`'s functions, their I-forms and ``*_init``, `mpidp.Comm`)
goes through `planned`, and so through the same steps:

    Call(comm)   take the next slot of the comm's tag sequence, first of all
    call.agree   (MPIDP_DEBUG) the ranks compare the arguments as passed, before
                 anything collective (auto's calibration, the placement query)
    Plan(...)    the checked arguments as rounds (a generator), with the call's tag;
                 `run()` blocks, `start()` returns an `engine.driver.Request`

and the slot goes back when the collective completes, or at once if planning
raises (the number stays used up, on this rank as on the others), or if the
collective's own work raises while it runs (a reduction that overflows under
``np.errstate(over="raise")``: the round before it is complete, so none of its
messages is in flight). A collective whose messages are still in flight (a
deadline passed) keeps its slot: they may yet complete.

What a signature determines (the algorithm `auto` picks, the blocks, the
scratch size, the signature folded into the tags) is worked out once per
distinct signature and communicator and remembered (`Call.setup`): a repeated
call pays one dict lookup for it. Every call still takes its own slot, and
still runs the ``MPIDP_DEBUG`` agreement check when it is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .. import flight
from ..config import debug_enabled
from ..flight import COMPLETE, ERROR, SIGNED, STATE, TAG
from .algorithms import Algorithm
from .algorithms.blocks import Blocks
from .algorithms.ops import Op
from .checks import agree, agree_total
from .engine.driver import Request, run
from .engine.staging import stager
from .state import check_user_tag, signature, state


def planned(body: Callable[..., Plan], comm, *args, tag: int | None = None, debug: bool = False,
            persistent: bool = False) -> Plan:
    """``body(call, *args)`` for a new `Call` on `comm`: how every entry point makes its plan.

    The functions (`api`), their I-forms and ``*_init`` pass a collective's plan
    (``plans.plan_allreduce`` ...); `mpidp.Comm` passes its parser (`dropin.parse`),
    which hands the parsed views to the same plans. The call's slot is taken first,
    and goes back if `body` raises. A persistent call's start is over once it is
    planned; another's when it runs (`Plan.run`, `Plan.start`).
    """
    call = Call(comm, tag, debug, persistent)
    try:
        plan = body(call, *args)
    except BaseException as e:
        call.failed(e)
        call.started()
        raise
    if persistent:
        call.started()
    return plan


class Signed(NamedTuple):
    """A call's signature (folded into its tags) and its description (the same fields
    by name, with the algorithm ``auto`` picked)."""

    collective: str
    sig: int
    description: dict


def signed(collective: str, count, dtype, op: Op | None, algorithm: str,
           root: int | None = None) -> Signed:
    """The signature of a call: `count` is the count, or the tuple of per-rank counts,
    that every rank passes alike; the signature is made of exactly these fields."""
    call = {"count": count, "dtype": dtype, "op": op and op.name, "algorithm": algorithm,
            "root": root}
    return Signed(collective, signature(collective, count, dtype, op and op.name, algorithm, root),
                  {k: v for k, v in call.items() if v is not None})


class Setup(NamedTuple):
    """What a call's signature determines, worked out once (`Call.setup`)."""

    signed: Signed  # its signature and description, with the algorithm `auto` picked
    algo: Algorithm  # the registered algorithm
    blocks: Blocks | None = None  # (a broadcast has none)
    scratch: int = 0  # items of scratch the algorithm needs


class Call:
    """One collective's place in its communicator's sequence: a slot now, a tag once planned.

    The slot is taken first, so a call that raises has used its number up on this
    rank as on the others; `end` gives the slot back when the collective is done.
    A persistent call (``*_init``) keeps its slot and tag until it is freed. With
    ``MPIDP_DEBUG`` (`debug`), the call is also a start on this thread until
    `started` (`state.CommState.begin_start`: two threads starting at once raise).
    """

    __slots__ = ("comm", "state", "slot", "user_tag", "debug", "persistent", "starting",
                 "entry")

    def __init__(self, comm, tag: int | None, debug: bool, persistent: bool = False):
        self.comm, self.persistent = comm, persistent
        self.debug = debug = debug_enabled(debug)
        self.starting = False
        self.state = st = state(comm)
        if tag is None:
            self.user_tag, self.slot = None, st.take()
        else:
            self.user_tag, self.slot = check_user_tag(tag), None
        rec = st.flight  # the flight recorder (mpidp.flight), or None
        self.entry = None if rec is None else rec.add(
            None if self.slot is None else st.started - 1)
        if persistent:
            if self.entry is not None:  # started many times, on one entry
                self.entry[STATE] = flight.PERSISTENT
            if self.slot is not None:
                try:
                    st.hold(self.slot)
                except RuntimeError:
                    st.release(self.slot)
                    raise
        if debug and self.slot is not None:  # an explicit tag: concurrency is the user's
            try:
                self.state.begin_start()
            except RuntimeError:
                self.end()
                raise
            self.starting = True

    def setup(self, key: tuple, build, *args):
        """What the signature `key` determines: ``build(*args)`` the first time, then
        remembered.

        `key` must hold every argument that `build` reads (the collective, counts,
        dtype, op name, requested algorithm, root), so that ranks making the same
        call find the same answer. Kept per communicator, beside the cost model
        (`set_model` forgets them, as the algorithm `auto` picks may change).
        """
        setups = self.state.setups
        try:
            found = setups.get(key)
        except TypeError:  # an unhashable argument: build() says what is wrong with it
            return build(*args)
        if found is None:
            found = build(*args)  # (it may calibrate: a new model, a new dict of setups)
            self.state.setups.remember(key, found)
        return found

    def agree(self, collective: str, **described) -> None:
        """(debug on) Every rank compares `described`, the arguments as passed, and all
        raise ValueError if they differ (`checks.agree`). Called after the local checks
        and before anything collective: ``auto``'s set-up is collective, and a rank that
        set up alone would wait there for the others forever."""
        agree(self.comm, collective, self._agreement_tag(), **described)

    def agree_total(self, collective: str, mine: int, total: int) -> None:
        """(debug on, after `agree`) Every rank's `mine` must add up to `total`
        (`checks.agree_total`: the exact sums' parts against ``addends``)."""
        agree_total(self.comm, collective, self._agreement_tag(), mine, total)

    def _agreement_tag(self) -> int:
        return self.user_tag if self.slot is None else self.state.tag(self.slot, 0,
                                                                      self.persistent)

    def tag(self, signed: Signed) -> int:
        """The tag for this call, with its signature folded in."""
        tag = self.user_tag if self.slot is None else self.state.tag(
            self.slot, signed.sig, self.persistent)
        if self.entry is not None:
            self.entry[SIGNED], self.entry[TAG] = signed, tag
        return tag

    def started(self) -> None:
        """The call has returned: its start on this thread is over (MPIDP_DEBUG)."""
        if self.starting:
            self.starting = False
            self.state.end_start()

    def end(self) -> None:
        if self.slot is not None:
            self.state.requests.pop(self.slot, None)
            (self.state.unhold if self.persistent else self.state.release)(self.slot)
            self.slot = None
        if self.persistent and self.entry is not None and self.entry[ERROR] is None:
            self.entry[STATE] = COMPLETE  # freed (another call's state is derived)

    def failed(self, e: BaseException) -> None:
        """Planning or running raised `e`: the slot goes back, the record says why."""
        self.end()
        if self.entry is not None:
            flight.fail(self.entry, e)


class Plan:
    """A collective ready to run: the algorithm and its arguments, and what to do after.

    Args:
        algo, args: the rounds are ``algo(*args)`` (a new generator for each run).
        finish: called when a run completes (copy the result out), or None.
        scratch: pooled arrays the runs use, given back when the plan is done with.
        buf: the buffer the rounds work on; decides, once, whether rounds need a
            `staging.Stager` (device buffers) or nothing (NumPy).
        algorithm: the registered `Algorithm` whose generator `algo` is (placement bound
            or not); None where the rounds are the call path's own (a copy first, the
            exact parts): what `engine.replay` asks whether a run may be replayed.
        src: the input the algorithm reads, if it is not in `buf` (None: in place).
    """

    __slots__ = ("call", "algo", "args", "tag", "finish", "scratch", "stager", "algorithm",
                 "src")

    def __init__(self, call: Call, algo, args: tuple, tag: int, finish=None, scratch=(),
                 buf=None, algorithm: Algorithm | None = None, src=None):
        self.call, self.algo, self.args, self.tag = call, algo, args, tag
        self.finish, self.scratch = finish, scratch
        self.algorithm, self.src = algorithm, src
        self.stager = None if buf is None else stager(buf, call.state.pool)

    def completed(self) -> None:
        """The one run of a plan is complete: finish, give the scratch and the slot back."""
        try:
            if self.finish is not None:
                self.finish()
        finally:
            self.free()

    def free(self) -> None:
        """Give the scratch and the slot back: the plan's run completed, or its own work
        raised (then none of its messages is in flight), or it is no longer wanted."""
        for arr in self.scratch:
            self.call.state.pool.give(arr)
        self.scratch = ()
        self.call.end()

    def start(self) -> Request:
        call, entry = self.call, self.call.entry
        if entry is not None and call.state.flight.agreeing is not None:
            call.state.flight.started()  # (most calls: no `started()` to call)
        try:
            request = Request(call.comm, self.algo(*self.args), self.tag, self.completed,
                              self.stager, self.free)
        except BaseException as e:  # its first round's own work (its slot is back)
            if entry is not None:
                flight.fail(entry, e)
            raise
        finally:
            if call.starting:  # (MPIDP_DEBUG) the I-form has returned: its start is over
                call.started()
        if call.slot is not None and not request.done:  # mpidp.Comm.Free completes it
            call.state.requests[call.slot] = request
        if entry is not None:  # read by a flight dump, for its state and round in flight
            entry[flight.REQUEST] = request
        return request

    def run(self) -> None:
        call, entry = self.call, self.call.entry
        # (the entry reads "started" once the driver hands it the round in flight)
        if entry is not None and call.state.flight.agreeing is not None:
            call.state.flight.started()  # (most calls: no `started()` to call)
        try:
            run(call.comm, self.algo(*self.args), self.tag, self.completed, self.stager, self.free,
                entry)
        except BaseException as e:
            if entry is not None:
                flight.fail(entry, e)
            raise
        finally:
            if call.starting:
                call.started()
