"""Sequences of collectives per rank, matched by tag: a hang replayed in one process.

`Sim` runs one collective: every rank's generator of the same algorithm, their
messages matched by (source, destination) alone. A program runs many, one after
another, on several communicators, and the runtime keeps them apart by tags
(`mpidp.collectives.state`: the k-th collective on a communicator takes the k-th
slot, with the call's signature folded in). `run_sequences` plays that part:

- Each rank has a program: a list of `Collective`s in the order it called them,
  each a generator of rounds, the tag its messages carry, the communicator
  (any name, and its members as world ranks: a round's peers are ranks of that
  communicator) and whether the call blocks. A blocking one must complete
  before the rank starts its next; a nonblocking one (an I-form) runs on beside
  the rank's later calls, as if a progress thread tested it (mpidp's requests
  advance only when tested: a hang that comes of a request nobody tests is not
  reproduced).
- A message matches only a message the other way with the same communicator,
  peer and tag, MPI's matching without wildcards; among those, the i-th send
  with the i-th receive (non-overtaking). A message that matches none stays
  posted: its round never completes and its rank stalls there, as it would
  under MPI, instead of exchanging another collective's data.
- A send of at most `eager` bytes is complete once posted (the MPI library
  buffers it, as MPICH and Open MPI do for small messages, so a rank whose small
  send nobody receives goes on to its next round); a larger one only once it is
  received.

When nothing can go on, the run is over: `SequenceRun` says which ranks
finished and, for every other, each collective it is stuck in, its round
(counted from 1, as the runtime's requests count them) and the messages of that
round not complete. No data move (buffers give sizes and dtypes only), and the
schedules of mpidp's algorithms do not depend on data, so the stalls are those
of any data. `mpidp.doctor --replay` builds the programs from flight records.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Hashable, Iterator
from typing import NamedTuple

from mpidp.collectives.algorithms.rounds import Recv, Send

from . import deadline
from .engine import TIMEOUT
from .reports import ScheduleError

EAGER = 65536  # bytes: where MPICH and Open MPI switch small sends to rendezvous on one host


class Collective(NamedTuple):
    """One call in a rank's program.

    Args:
        rounds: the algorithm's generator for this rank (rounds of Send/Recv, peers
            in ranks of `comm`).
        tag: the tag its messages carry (the runtime's: `CommState.tag`).
        comm: the communicator's name; messages match only within one.
        members: the world rank of each rank of `comm` (None: the world itself).
        blocking: the rank waits for it before its next call.
        label: anything, handed back in a `Stall` (the flight record's entry).
    """

    rounds: Iterator
    tag: int
    comm: Hashable = "world"
    members: tuple | None = None
    blocking: bool = True
    label: object = None


class Pending(NamedTuple):
    """A message of a stalled round: ``kind`` "send" or "recv", the peer in the
    communicator's ranks and in world ranks, its bytes."""

    kind: str
    peer: int
    world: int
    nbytes: int


class Stall(NamedTuple):
    """A collective that cannot complete: rank `rank`'s call number `index` of its program."""

    rank: int
    index: int
    label: object
    comm: Hashable
    tag: int
    round: int  # rounds posted, the stuck one included (1: stuck in the first)
    pending: tuple  # of Pending


class SequenceRun:
    """What became of every rank's program (`run_sequences`)."""

    def __init__(self, size: int, steps: int, stalls: dict, blocked: list, started: list,
                 lengths: list, rounds: list):
        self.size, self.steps, self.rounds = size, steps, rounds  # rounds posted per rank
        self.stalls: dict[int, list[Stall]] = stalls  # rank -> the collectives it is stuck in
        self.blocked: list[Stall | None] = blocked  # the blocking call each rank waits in
        self.started = started  # calls each rank started
        self.lengths = lengths  # calls in each rank's program
        self.finished = [r for r in range(size) if r not in stalls]  # all its calls complete

    @property
    def stalled(self) -> list[int]:
        """The ranks with a collective that cannot complete."""
        return sorted(self.stalls)

    def __repr__(self) -> str:
        return (f"<SequenceRun of {self.size} ranks: finished {self.finished}, "
                f"stalled {self.stalled}>")


class _Lane:
    """A collective in flight on one rank."""

    __slots__ = ("rank", "index", "call", "rounds", "members", "pending", "round", "posted")

    def __init__(self, rank: int, index: int, call: Collective, size: int):
        self.rank, self.index, self.call, self.rounds = rank, index, call, call.rounds
        self.members = call.members if call.members is not None else range(size)
        self.pending = 0  # messages of its current round not complete
        self.round = 0
        self.posted: list = []  # its current round's messages: [kind, peer, nbytes, done]


def run_sequences(programs: list, eager: int = EAGER,
                  timeout: float | None = TIMEOUT) -> SequenceRun:
    """Run every rank's program (``programs[r]``: a list of `Collective`) until nothing moves.

    Raises `ScheduleError` for what would be an error under MPI, not a hang: a round
    that is not a list of Send/Recv, a peer out of its communicator, a matched pair
    whose sizes or dtypes differ (MPI_ERR_TRUNCATE), a rank not a member of a
    communicator it calls on, a generator that runs past `timeout` seconds without
    yielding.
    """
    size = len(programs)
    programs = [list(p) for p in programs]
    for r, program in enumerate(programs):
        for i, c in enumerate(program):
            if c.members is not None and r not in c.members:
                raise ScheduleError(f"rank {r}, call {i}: not a member of {c.comm!r} "
                                    f"({list(c.members)})")
    gens = [c.rounds for p in programs for c in p]
    watch = deadline.start(gens, timeout)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Runner(size, programs, eager, watch).run()
    except deadline.Overran:
        raise ScheduleError(f"a generator ran for more than {timeout:g} s without yielding "
                            "(an endless loop?)") from None
    finally:
        deadline.stop(watch)
        if collecting:
            gc.enable()


class _Runner:
    def __init__(self, size, programs, eager, watch):
        self.size, self.programs, self.eager, self.watch = size, programs, eager, watch
        self.next = [0] * size  # each rank's next call
        self.blocked: list[_Lane | None] = [None] * size  # the blocking call it waits in
        self.live: list[set] = [set() for _ in range(size)]  # its lanes in flight
        # (comm, src, dst, tag) -> the unmatched messages on it: all sends or all receives
        self.waiting: dict[tuple, deque] = {}
        self.rounds = [0] * size  # rounds each rank posted, all its calls together

    def start(self, rank: int, out: list) -> None:
        """Start `rank`'s calls up to its next blocking one; their lanes go to `out`."""
        program = self.programs[rank]
        while self.blocked[rank] is None and self.next[rank] < len(program):
            i = self.next[rank]
            lane = _Lane(rank, i, program[i], self.size)
            self.next[rank] += 1
            self.live[rank].add(lane)
            out.append(lane)
            if lane.call.blocking:
                self.blocked[rank] = lane

    def run(self) -> SequenceRun:
        ready: list = []
        for r in range(self.size):
            self.start(r, ready)
        step = 0
        while ready:
            if self.watch is not None:
                self.watch.step = step
            posted, i = [], 0
            while i < len(ready):  # a lane that ends lets its rank start more: appended
                lane = ready[i]
                i += 1
                try:
                    round_ = next(lane.rounds)
                except StopIteration:
                    self.live[lane.rank].discard(lane)
                    if self.blocked[lane.rank] is lane:
                        self.blocked[lane.rank] = None
                        self.start(lane.rank, ready)
                    continue
                except ScheduleError:
                    raise
                except Exception as e:
                    raise ScheduleError(f"rank {lane.rank}, call {lane.index} ({lane.call.comm}"
                                        f", tag {lane.call.tag}), after round {lane.round}: "
                                        f"the algorithm raised {type(e).__name__}: {e}") from e
                posted.append((lane, round_))
            ready = []
            for lane, round_ in posted:
                self.post(lane, round_, ready)
            step += 1
        return self.result(step)

    def post(self, lane: _Lane, round_, ready: list) -> None:
        if not isinstance(round_, list):
            raise ScheduleError(f"rank {lane.rank}, call {lane.index}: a round is a list of "
                                f"Send and Recv, got {type(round_).__name__}")
        lane.round += 1
        self.rounds[lane.rank] += 1
        lane.posted, lane.pending = [], 0
        members, comm, tag, me = lane.members, lane.call.comm, lane.call.tag, lane.rank
        for m in round_:
            kind = type(m)
            if kind is not Send and kind is not Recv:
                raise ScheduleError(f"rank {me}, call {lane.index}, round {lane.round}: a "
                                    f"round holds Send and Recv only, not {m!r:.60}")
            if not 0 <= m.peer < len(members):
                raise ScheduleError(f"rank {me}, call {lane.index}, round {lane.round}: peer "
                                    f"{m.peer!r} is not a rank of {comm!r} "
                                    f"({len(members)} ranks)")
            peer = members[m.peer]
            nbytes = m.buf.nbytes
            done = kind is Send and nbytes <= self.eager  # buffered: complete for its sender
            msg = [kind, m.peer, nbytes, done, lane, m.buf]
            lane.posted.append(msg)
            if not done:
                lane.pending += 1
            key = (comm, me, peer, tag) if kind is Send else (comm, peer, me, tag)
            queue = self.waiting.get(key)
            if not queue or queue[0][0] is kind:
                self.waiting.setdefault(key, deque()).append(msg)
                continue
            other = queue.popleft()
            send, recv = (msg, other) if kind is Send else (other, msg)
            if send[2] != recv[2] or send[5].dtype != recv[5].dtype:
                raise ScheduleError(
                    f"{comm!r}, tag {tag}: rank {key[1]} sends {send[5].size} x "
                    f"{send[5].dtype} to rank {key[2]}, which receives into {recv[5].size} x "
                    f"{recv[5].dtype} (MPI: a truncation error, or a receive left short)")
            if not msg[3]:
                msg[3] = True
                lane.pending -= 1
            if not other[3]:  # its lane was waiting for it (not an eager send)
                other[3] = True
                owner = other[4]
                owner.pending -= 1
                if owner.pending == 0 and owner is not lane:  # (mine: once all are posted)
                    ready.append(owner)
        if lane.pending == 0:
            ready.append(lane)

    def result(self, steps: int) -> SequenceRun:
        stalls: dict[int, list[Stall]] = {}
        for r in range(self.size):
            for lane in sorted(self.live[r], key=lambda x: x.index):
                pending = tuple(Pending("send" if p[0] is Send else "recv", p[1],
                                        lane.members[p[1]], p[2])
                                for p in lane.posted if not p[3])
                stalls.setdefault(r, []).append(Stall(r, lane.index, lane.call.label,
                                                      lane.call.comm, lane.call.tag,
                                                      lane.round, pending))
        blocked = [None if self.blocked[r] is None else
                   next(s for s in stalls[r] if s.index == self.blocked[r].index)
                   for r in range(self.size)]
        return SequenceRun(self.size, steps, stalls, blocked, list(self.next),
                           [len(p) for p in self.programs], self.rounds)
