"""The simulator's engine: N ranks' schedules advanced together in one process.

Every mpidp algorithm is a generator that yields rounds of `Send`/`Recv`
descriptions and calls nothing but ``comm.Get_rank()`` and ``comm.Get_size()``.
`Sim.run` gives each rank a `SimComm` that answers those two, advances all N
generators, and plays MPI's part, step by step:

- In step t every rank whose last round is complete resumes (its generator does
  the round's local work, a reduction, and yields the next round) and posts that
  round. A message is matched as soon as its `Send` and its `Recv` are both posted:
  the i-th send from rank a to rank b with the i-th receive at b from a, MPI's
  non-overtaking order. Its data are copied then. A round is complete when all its
  messages are matched; its rank resumes in step t + 1. So a step is one α of an
  ideal machine, and the number of steps is the schedule's critical path in rounds.
- Sends are never buffered: a send that nobody receives blocks its rank, as a
  large one does under MPI. When no rank can go on and some have not finished, the
  run stops with a `ScheduleError` that lists each blocked rank, its round and what
  it waits for. A matched pair that differs in size or dtype, a round that receives
  into memory it also sends from (or receives twice into the same memory), a
  buffer that is not a contiguous NumPy array and a peer out of range are errors too.
- Counters: bytes and messages sent and received per rank and per directed link,
  rounds per rank, reduced items per rank (through `Sim.op`), and steps.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

import numpy as np

from mpidp.collectives.schedule import Recv, Send

from .reports import ScheduleError, deadlock, describe, locate


class SimComm:
    """What an algorithm sees of its communicator in the simulator: its rank, the size and
    the placement (the host of each rank; None: one host), as `topology.known` reads it."""

    __slots__ = ("rank", "size", "placement")

    def __init__(self, rank: int, size: int, placement: tuple | None = None):
        self.rank, self.size, self.placement = rank, size, placement

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def __getattr__(self, name):
        raise AttributeError(f"SimComm has no {name!r}: in mpidp.sim an algorithm only reads "
                             "Get_rank()/Get_size() and yields rounds of Send/Recv")


class CountingOp:
    """An `Op` that adds the items it reduces to its rank's counter."""

    __slots__ = ("op", "counts", "rank")

    def __init__(self, op, counts: list, rank: int):
        self.op, self.counts, self.rank = op, counts, rank

    def __call__(self, acc, tmp, src=None) -> None:
        self.counts[self.rank] += acc.size
        self.op(acc, tmp, src)

    def finish(self, block, n: int) -> None:
        self.op.finish(block, n)

    def __getattr__(self, name):
        return getattr(self.op, name)


class Sim:
    """N simulated ranks: `run` their generators; then read the counters.

    Args:
        size: N, the number of ranks.
        trace: keep every matched message in ``events`` as ``(step, src, dst, sendbuf,
            recvbuf, i, j)``, i and j its places in the two rounds (for tables, drawings).
        timer: an object with ``post(rank)``, ``message(src, dst, nbytes, i, j)``,
            ``flush()`` (the step's messages are all matched), ``complete(rank)`` and
            ``work(rank, items)``: `mpidp.sim.predict.Timer`.
        on_step: called as ``on_step(sim, step)`` once the ranks that resume in a step
            have done their local work, before they post: ``on_step(sim, t)`` sees the
            buffers after step t - 1 (t = 0: at the start; t = steps: at the end).
        max_steps: stop with a `ScheduleError` after this many steps (a loop that never ends).
        placement: the host of each rank (`mpidp.collectives.topology`); None: one host.
    """

    def __init__(self, size: int, trace: bool = False, timer=None, on_step=None,
                 max_steps: int | None = None, placement: tuple | None = None):
        self.size, self.max_steps = size, max_steps
        if placement is not None and len(placement) != size:
            raise ValueError(f"a placement of {len(placement)} ranks for {size} ranks")
        self.comms = [SimComm(r, size, placement) for r in range(size)]
        self.bytes_sent, self.bytes_received = [0] * size, [0] * size
        self.messages_sent, self.messages_received = [0] * size, [0] * size
        self.rounds, self.reduced = [0] * size, [0] * size
        self._links: dict[int, int] = {}  # src * size + dst -> bytes
        self.steps = 0
        self.events: list | None = [] if trace else None
        self.timer, self.on_step = timer, on_step
        self.where: list[dict] = [{} for _ in range(size)]  # rank -> {name: array}, for reports

    def op(self, op, rank: int) -> CountingOp:
        """`op` for rank `rank`, counting the items it reduces."""
        return CountingOp(op, self.reduced, rank)

    # ------------------------------------------------------------------ the driver

    def run(self, gens) -> Sim:
        """Advance every rank's generator (``gens[r]`` for rank r) to its end."""
        gens = list(gens)
        N, timer = self.size, self.timer
        # src * N + dst -> [Send or Recv, deque of the unmatched buffers of that kind]: on
        # one link only sends or only receives can be waiting (two would have matched)
        waiting: dict[int, list] = {}
        pending = [0] * N  # unmatched messages of each rank's current round
        finished = [False] * N
        rounds, reduced, deliver = self.rounds, self.reduced, self._deliver
        ready, step = list(range(N)), 0
        while ready:
            posted = []
            if self.max_steps is not None and step > self.max_steps:
                raise ScheduleError(f"more than {self.max_steps} steps: does the algorithm end?")
            for r in ready:  # each resumes: the last round's local work, then its next round
                before = reduced[r]
                try:
                    posted.append((r, next(gens[r])))
                except StopIteration:
                    finished[r] = True
                except ScheduleError:
                    raise
                except Exception as e:  # the algorithm's own error: say where it happened
                    where = f"after round {rounds[r] - 1}" if rounds[r] else \
                        "before its first round"
                    raise ScheduleError(f"step {step}: rank {r}, {where}: the algorithm raised "
                                        f"{type(e).__name__}: {e}") from e
                if timer is not None:
                    timer.work(r, reduced[r] - before)
            if self.on_step is not None:
                self.on_step(self, step)
            complete = []
            for r, round_ in posted:
                rounds[r] += 1
                if timer is not None:
                    timer.post(r)
                if len(round_) == 2:  # the common case: two buffers of one array may overlap
                    x, y = round_[0].buf, round_[1].buf
                    xb, yb = getattr(x, "base", None), getattr(y, "base", None)
                    if (x if xb is None else xb) is (y if yb is None else yb):
                        self._check_round(r, round_)
                elif len(round_) > 2:
                    self._check_round(r, round_)
                pending[r] = len(round_)
                for i, m in enumerate(round_):
                    kind, peer = type(m), m.peer
                    if peer.__class__ is not int and not isinstance(peer, np.integer) or \
                            not 0 <= peer < N:
                        raise ScheduleError(f"step {step}: rank {r}, round {rounds[r] - 1}: "
                                            f"peer {peer!r} is not a rank of {N}")
                    if kind is Send:
                        key = r * N + peer
                    elif kind is Recv:
                        key = peer * N + r
                    else:
                        raise ScheduleError(f"rank {r}, round {rounds[r] - 1}: a round holds "
                                            f"Send and Recv only, not {m!r}")
                    entry = waiting.get(key)
                    if entry is None:
                        waiting[key] = [kind, deque(((m.buf, i),))]
                        continue
                    if entry[0] is kind or not entry[1]:
                        entry[0] = kind
                        entry[1].append((m.buf, i))
                        continue
                    other, j = entry[1].popleft()
                    if kind is Send:
                        deliver(step, r, m.buf, i, peer, other, j)
                    else:
                        deliver(step, peer, other, j, r, m.buf, i)
                    pending[r] -= 1
                    pending[peer] -= 1
                    if pending[peer] == 0 and peer != r:  # it was waiting for this message
                        complete.append(peer)
                if pending[r] == 0:
                    complete.append(r)
            if timer is not None:
                timer.flush()  # time this step's messages
                for r in complete:
                    timer.complete(r)
            if complete:
                step += 1
            ready = sorted(complete)
        self.steps = step
        if not all(finished):
            raise ScheduleError(deadlock(self, step, finished, waiting))
        return self

    def _deliver(self, step: int, src: int, sbuf, spos: int, dst: int, rbuf, rpos: int) -> None:
        """Match a send with its receive: check the pair, copy the data, count.

        `spos`, `rpos`: the places of the send and of the receive in their rounds.
        """
        if sbuf.__class__ is not np.ndarray or rbuf.__class__ is not np.ndarray or \
                not (sbuf.flags.c_contiguous and rbuf.flags.c_contiguous):
            raise ScheduleError(f"step {step}: rank {src} to rank {dst}: message buffers must be "
                                f"contiguous NumPy arrays, got {type(sbuf).__name__} "
                                f"{getattr(sbuf, 'strides', '')} and {type(rbuf).__name__} "
                                f"{getattr(rbuf, 'strides', '')}")
        nbytes = sbuf.nbytes
        if nbytes != rbuf.nbytes or sbuf.dtype != rbuf.dtype:
            raise ScheduleError(
                f"step {step}: rank {src} sends {self._what(src, sbuf)} to rank {dst}, which "
                f"receives into {self._what(dst, rbuf)}: sizes and dtypes must match")
        rbuf[...] = sbuf
        self.bytes_sent[src] += nbytes
        self.bytes_received[dst] += nbytes
        self.messages_sent[src] += 1
        self.messages_received[dst] += 1
        key = src * self.size + dst
        self._links[key] = self._links.get(key, 0) + nbytes
        if self.events is not None:
            self.events.append((step, src, dst, sbuf, rbuf, spos, rpos))
        if self.timer is not None:
            self.timer.message(src, dst, nbytes, spos, rpos)

    @property
    def links(self) -> dict[tuple[int, int], int]:
        """Bytes per directed link: {(src, dst): bytes}."""
        return {divmod(k, self.size): v for k, v in sorted(self._links.items())}

    def _check_round(self, rank: int, round_) -> None:
        """No receive of a round may write memory that another message of it reads or writes."""
        if len(round_) == 2:  # the common case, checked by NumPy directly
            a, b = round_
            x, y = a.buf, b.buf
            if (type(a) is Recv or type(b) is Recv) and type(x) is np.ndarray and \
                    type(y) is np.ndarray and x.size and y.size and np.shares_memory(x, y):
                self._overlap(rank, a, b)
            return
        spans = []
        for m in round_:
            if type(m.buf) is np.ndarray and m.buf.size:
                lo = m.buf.__array_interface__["data"][0]
                spans.append((lo, lo + m.buf.nbytes, m))
        writes = sorted((s for s in spans if type(s[2]) is Recv), key=lambda s: s[0])
        for x, y in zip(writes, writes[1:], strict=False):
            if y[0] < x[1]:
                self._overlap(rank, x[2], y[2])
        starts = [s[0] for s in writes]
        for lo, hi, m in spans:
            if type(m) is Send:
                i = bisect_right(starts, hi - 1) - 1  # the last write starting below hi
                if i >= 0 and writes[i][1] > lo:
                    self._overlap(rank, m, writes[i][2])

    def _overlap(self, rank: int, a, b):
        raise ScheduleError(
            f"rank {rank}, round {self.rounds[rank] - 1}: {type(a).__name__} "
            f"{self._what(rank, a.buf)} (peer {a.peer}) and {type(b).__name__} "
            f"{self._what(rank, b.buf)} (peer {b.peer}) use the same memory: a round must not "
            "write into memory that another of its messages reads or writes")

    # ------------------------------------------------------------------ reports

    def locate(self, rank: int, view) -> tuple[str, int, int] | None:
        """(name, start, stop) of `view` in one of the rank's registered arrays, or None."""
        return locate(self.where[rank], view)

    def _what(self, rank: int, buf) -> str:
        return describe(self.where[rank], buf)
