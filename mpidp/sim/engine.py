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
  buffer that is not a contiguous NumPy array and a peer out of range are errors too
  (their messages: `roundcheck.py`).
- Counters: bytes and messages sent and received per rank and per directed link,
  rounds per rank, reduced items per rank (through `Sim.op`), and steps.
"""

from __future__ import annotations

import gc
from collections import deque

import numpy as np

from mpidp.collectives.algorithms.ops import Wrapper
from mpidp.collectives.algorithms.rounds import Group, Recv, Send

from . import deadline, roundcheck
from .reports import ScheduleError, deadlock, describe, locate

TIMEOUT = 10.0  # seconds a resume may run by default: far more than any real one takes


SimComm = Group  # what an algorithm sees of its communicator: Get_rank() and Get_size()


class CountingOp(Wrapper):
    """An `Op` that adds the items it reduces to its rank's counter."""

    __slots__ = ("counts", "rank")

    def __init__(self, op, counts: list, rank: int):
        self.op, self.counts, self.rank = op, counts, rank

    def __call__(self, acc, tmp, src=None) -> None:
        self.counts[self.rank] += acc.size
        self.op(acc, tmp, src)


class TallyOp(CountingOp):
    """A `CountingOp` that only counts: for a run that moves no data (``Sim(data=False)``)."""

    __slots__ = ()

    def __call__(self, acc, tmp, src=None) -> None:
        self.counts[self.rank] += acc.size

    def finish(self, block, n: int) -> None:
        pass


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
        placement: the host of each rank (`mpidp.collectives.placement`; None: one host),
            kept as ``placement`` for the record: `simulate` hands it to the algorithms
            that read it, as the entry points hand them the communicator's.
        timeout: seconds one resume of a generator may run (its local work and the
            making of its next round) before it is stopped with a `ScheduleError`: an
            endless loop without ``yield`` (`mpidp.sim.deadline`); None: no bound.
        data: False: match and count every message but copy none, and give the
            algorithms `TallyOp`s (`op`) that count and reduce nothing. The counters,
            steps and timer are those of the real run, for every schedule that does not
            depend on the data (mpidp's algorithms); the buffers end up meaningless.
    """

    def __init__(self, size: int, trace: bool = False, timer=None, on_step=None,
                 max_steps: int | None = None, placement: tuple | None = None,
                 timeout: float | None = TIMEOUT, data: bool = True):
        self.size, self.max_steps, self.timeout, self.data = size, max_steps, timeout, data
        if placement is not None and len(placement) != size:
            raise ValueError(f"a placement of {len(placement)} ranks for {size} ranks")
        self.placement = placement
        self.comms = [SimComm(r, size) for r in range(size)]
        self.bytes_sent, self.bytes_received = [0] * size, [0] * size
        self.messages_sent, self.messages_received = [0] * size, [0] * size
        self.rounds, self.reduced = [0] * size, [0] * size
        self._links: dict[int, int] = {}  # src * size + dst -> bytes
        self.steps = 0
        self.events: list | None = [] if trace else None
        self.timer, self.on_step = timer, on_step
        self.where: list[dict] = [{} for _ in range(size)]  # rank -> {name: array}, for reports

    def op(self, op, rank: int) -> CountingOp:
        """`op` for rank `rank`, counting the items it reduces (only counting them, if the
        run moves no data)."""
        return (CountingOp if self.data else TallyOp)(op, self.reduced, rank)

    # ------------------------------------------------------------------ the driver

    def run(self, gens) -> Sim:
        """Advance every rank's generator (``gens[r]`` for rank r) to its end."""
        gens = list(gens)
        watch = deadline.start(gens, self.timeout)
        collecting = gc.isenabled()
        gc.disable()  # the rounds are garbage at once, freed by their counts: the cyclic
        try:  # collector would only walk the N generators again and again
            self._run(gens, watch)
        except deadline.Overran:  # it landed just after the resume returned
            raise ScheduleError(self._overran(*(watch.seen or (0, -1)))) from None
        finally:
            deadline.stop(watch)
            if collecting:
                gc.enable()
        return self

    def _run(self, gens: list, watch) -> None:
        N, timer, events, data = self.size, self.timer, self.events, self.data
        # src * N + dst -> deque of the unmatched (message, place in its round) on that
        # link; they are all sends or all receives (a send and a receive would have matched)
        waiting: dict[int, deque] = {}
        pending = [0] * N  # unmatched messages of each rank's current round
        finished = [False] * N
        rounds, reduced = self.rounds, self.reduced
        sent, received = self.bytes_sent, self.bytes_received
        msent, mreceived, links = self.messages_sent, self.messages_received, self._links
        ndarray = np.ndarray
        ready, step = list(range(N)), 0
        while ready:
            if watch is not None:
                watch.step = step
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
                except deadline.Overran:
                    raise ScheduleError(self._overran(step, r)) from None
                except Exception as e:  # the algorithm's own error: say where it happened
                    raise ScheduleError(f"step {step}: rank {r}, {self._after(r)}: the "
                                        f"algorithm raised {type(e).__name__}: {e}") from e
                if timer is not None:
                    timer.work(r, reduced[r] - before)
            if self.on_step is not None:
                self.on_step(self, step)
            complete = []
            for r, round_ in posted:
                if round_.__class__ is not list and not isinstance(round_, list):
                    raise ScheduleError(f"step {step}: rank {r}, round {rounds[r]}: a round is "
                                        f"a list of Send and Recv, got {roundcheck.short(round_)}")
                rounds[r] += 1
                if timer is not None:
                    timer.post(r)
                n = pending[r] = len(round_)
                for i, m in enumerate(round_):
                    kind = m.__class__
                    if kind is not Send and kind is not Recv:
                        raise ScheduleError(f"step {step}: rank {r}, round {rounds[r] - 1}: a "
                                            "round holds Send and Recv only, not "
                                            f"{roundcheck.short(m)}")
                    peer, buf = m.peer, m.buf
                    if peer.__class__ is not int and not isinstance(peer, np.integer) or \
                            not 0 <= peer < N:
                        raise ScheduleError(f"step {step}: rank {r}, round {rounds[r] - 1}: "
                                            f"peer {peer!r} is not a rank of {N}")
                    if buf.__class__ is not ndarray or not buf.flags.c_contiguous:
                        roundcheck.bad_buffer(self, step, r, m)
                    key = r * N + peer if kind is Send else peer * N + r  # src * N + dst
                    queue = waiting.get(key)
                    if queue is None:
                        waiting[key] = deque(((m, i),))
                        continue
                    if not queue or queue[0][0].__class__ is kind:
                        queue.append((m, i))
                        continue
                    other, j = queue.popleft()  # matched: the pair's data moves now
                    if kind is Send:
                        src, dst, sbuf, rbuf = r, peer, buf, other.buf
                    else:
                        src, dst, sbuf, rbuf, i, j = peer, r, other.buf, buf, j, i
                    nbytes = sbuf.nbytes
                    if nbytes != rbuf.nbytes or sbuf.dtype != rbuf.dtype:
                        raise ScheduleError(
                            f"step {step}: rank {src} sends {self._what(src, sbuf)} to rank "
                            f"{dst}, which receives into {self._what(dst, rbuf)}: sizes and "
                            "dtypes must match")
                    if data:
                        rbuf[...] = sbuf
                    sent[src] += nbytes
                    received[dst] += nbytes
                    msent[src] += 1
                    mreceived[dst] += 1
                    links[key] = links.get(key, 0) + nbytes
                    if events is not None:  # i, j: the places of the send and the receive
                        events.append((step, src, dst, sbuf, rbuf, i, j))
                    if timer is not None:
                        timer.message(src, dst, nbytes, i, j)
                    pending[r] -= 1
                    pending[peer] -= 1
                    if pending[peer] == 0 and peer != r:  # it was waiting for this message
                        complete.append(peer)
                if n == 2:  # the common case: a send and a receive, mostly in two arrays
                    a, b = round_
                    x, y = a.buf, b.buf
                    xb, yb = x.base, y.base  # (NumPy points a view's base at the owner)
                    if (x if xb is None else xb) is (y if yb is None else yb) and \
                            (a.__class__ is Recv or b.__class__ is Recv) and x.size and \
                            y.size and np.shares_memory(x, y):
                        roundcheck.overlap(self, step, r, a, b)
                elif n > 2:
                    roundcheck.check_round(self, step, r, round_)
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

    def _after(self, rank: int) -> str:
        rounds = self.rounds[rank]
        return f"after round {rounds - 1}" if rounds else "before its first round"

    def _overran(self, step: int, rank: int) -> str:
        where = f"rank {rank}, {self._after(rank)}" if rank >= 0 else "between two resumes"
        return (f"step {step}: {where}: the algorithm ran for more than {self.timeout:g} s "
                "without yielding (an endless loop? a round is yielded as a list of Send/Recv)")

    @property
    def links(self) -> dict[tuple[int, int], int]:
        """Bytes per directed link: {(src, dst): bytes}."""
        return {divmod(k, self.size): v for k, v in sorted(self._links.items())}

    # ------------------------------------------------------------------ reports

    def locate(self, rank: int, view) -> tuple[str, int, int] | None:
        """(name, start, stop) of `view` in one of the rank's registered arrays, or None."""
        return locate(self.where[rank], view)

    def _what(self, rank: int, buf) -> str:
        return describe(self.where[rank], buf)
