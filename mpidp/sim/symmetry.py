"""A collective's schedule as a list of steps: what each step moves, found by simulation.

`full` runs the unchanged generators of all N ranks on the engine (`Sim`, no data
moved) and records, step by step, the most any rank or host link carries. `by_symmetry`
finds the same list from the ranks of one host alone, for the schedules in which every
host does what host 0 does (`symmetric`): the ring on equal hosts, recursive halving
and doubling (Rabenseifner) on powers of two, hierarchical on equal hosts, direct.
Its rounds need no partner to run (the schedules do not depend on the data), so
16,384 ranks cost one host's generators, not 16,384 of them; tests/test_sim_step.py
checks both give the same `Schedule` wherever the full one runs (N <= 256).

A step of a `Schedule` is one round of a lock-step schedule: round t of every rank is
matched in engine step t (the test above checks that too, as the full run counts
steps, the symmetric one rounds).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.rounds import Group, Send
from mpidp.collectives.mpiops import resolve_op
from mpidp.collectives.placement import layout

from .collective import resolve, simulate
from .engine import TallyOp

ITEM = 4  # float32: the bytes of one simulated item
TRANSLATED = ("ring", "direct")  # schedules alike under rank -> rank + c (mod N)
FULL_LIMIT = 4096  # ranks: past this a full simulation takes minutes


class Step(NamedTuple):
    """One step: the most messages one rank sends or receives (each pays α), whether any
    crosses hosts, the most bytes one rank sends or receives within its host, the most
    bytes through one host link in one direction, the most items one rank reduces after it."""

    messages: int
    across: bool
    port: int
    link: int
    reduced: int


class Schedule(NamedTuple):
    """The steps of one collective on `count` float32 items, and per-rank totals (bytes)."""

    collective: str
    algorithm: str
    N: int
    ppn: int
    count: int
    steps: tuple
    sent: tuple  # (least, most) bytes one rank sends
    received: tuple  # (least, most) bytes one rank receives
    link: int  # bytes through the busiest host link, in its busier direction
    how: str  # "full" or "symmetry"


def sim_items(collective: str, algorithm: str, N: int) -> int:
    """Items that split into whole blocks for N and its power of two (and a host's pieces);
    2 for an algorithm whose scratch is a vector per rank (whole vectors travel)."""
    q = 1 << (N.bit_length() - 1)
    count = 2 * N * q // math.gcd(N, q)
    _, scratch, _ = resolve(collective, algorithm)
    if scratch is not None and scratch(Blocks.even(count, N)) > 2 * count:
        return 2
    return count


def _power(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def equal_hosts(placement, N: int) -> int | None:
    """P if `placement` puts P ranks on each host, numbered host by host (0: one host, or
    none given); None for any other placement."""
    if placement is None or not any(placement):
        return 0
    P = list(placement).count(0)
    return P if tuple(placement) == layout(N, ppn=P) and N % P == 0 else None


def symmetric(collective: str, algorithm: str, N: int, ppn: int = 0) -> bool:
    """True where every host's ranks do what host 0's do, round by round (equal hosts)."""
    if ppn and N % ppn:
        return False  # unequal hosts: the last one differs
    if algorithm in ("ring", "direct", "hierarchical"):
        return True
    if algorithm in ("rabenseifner", "recursive_halving", "recursive_doubling"):
        return _power(N) and (not ppn or _power(ppn))
    return False


class _Record:
    """A `Sim` timer that records each step's messages and reductions as `Step`s."""

    def __init__(self, N: int, hosts: tuple):
        self.hosts, self.steps = hosts, []
        self.now: list = []  # (src, dst, nbytes) of the step being matched
        self.reduce = [0] * N  # items each rank reduced after the last recorded step

    def post(self, rank: int) -> None:
        pass

    def message(self, src: int, dst: int, nbytes: int, i: int = 0, j: int = 0) -> None:
        self.now.append((src, dst, nbytes))

    def work(self, rank: int, items: int) -> None:
        if self.steps and items:  # the local work after a step: that step's reductions
            s = self.steps[-1]
            self.steps[-1] = s._replace(reduced=max(s.reduced, items))

    def complete(self, rank: int) -> None:
        pass

    def flush(self) -> None:
        if self.now:
            self.steps.append(_step(self.now, self.hosts))
            self.now = []


def _step(messages, hosts) -> Step:
    """The `Step` of (src, dst, nbytes) messages on ranks placed on `hosts`."""
    out, into, sends, recvs, port_out, port_in = {}, {}, {}, {}, {}, {}
    across = False
    for src, dst, nbytes in messages:
        sends[src] = sends.get(src, 0) + 1
        recvs[dst] = recvs.get(dst, 0) + 1
        a, b = hosts[src], hosts[dst]
        if a != b:
            across = True
            out[a] = out.get(a, 0) + nbytes
            into[b] = into.get(b, 0) + nbytes
        else:
            port_out[src] = port_out.get(src, 0) + nbytes
            port_in[dst] = port_in.get(dst, 0) + nbytes
    most = max([*sends.values(), *recvs.values()])
    return Step(most, across, max([0, *port_out.values(), *port_in.values()]),
                max([0, *out.values(), *into.values()]), 0)


def full(collective: str, algorithm: str, N: int, ppn: int = 0) -> Schedule:
    """The `Schedule` of all N ranks run together on the engine."""
    if N > FULL_LIMIT:
        raise ValueError(f"{algorithm} on {N} ranks: no symmetry to use here, and a full "
                         f"simulation runs to {FULL_LIMIT} ranks")
    count = sim_items(collective, algorithm, N)
    hosts = layout(N, ppn=ppn)
    record = _Record(N, hosts)
    out = simulate(collective, algorithm, N, count, dtype="float32", timer=record,
                   placement=hosts if ppn else None, data=False)
    s = out.sim
    link = 0
    if ppn:
        through = [0] * (2 * (max(hosts) + 1))
        for (a, b), nbytes in s.links.items():
            if hosts[a] != hosts[b]:
                through[2 * hosts[a]] += nbytes
                through[2 * hosts[b] + 1] += nbytes
        link = max(through)
    return Schedule(collective, algorithm, N, ppn, count, tuple(record.steps),
                    (min(s.bytes_sent), max(s.bytes_sent)),
                    (min(s.bytes_received), max(s.bytes_received)), link, "full")


def _generator(collective: str, algorithm: str, rank: int, N: int, count: int, hosts, counts):
    """Rank `rank`'s generator on buffers of the entry point's sizes, no data (`TallyOp`)."""
    fn, scratch, _ = resolve(collective, algorithm, placement=hosts)
    comm, dt = Group(rank, N), np.dtype("float32")
    if collective == "allgather":
        blocks = Blocks.even(count, N)
        return fn(comm, np.zeros(blocks.total, dt), blocks)
    blocks = Blocks.even(count, N)
    op = TallyOp(resolve_op("sum"), counts, rank)
    return fn(comm, np.zeros(blocks.total, dt), blocks, op, np.zeros(scratch(blocks), dt),
              np.zeros(blocks.total, dt))


def by_symmetry(collective: str, algorithm: str, N: int, ppn: int = 0) -> Schedule:
    """The `Schedule` from host 0's ranks alone (`symmetric` schedules only)."""
    if not symmetric(collective, algorithm, N, ppn):
        raise ValueError(f"{algorithm} on {N} ranks ({ppn or N} a host) has no symmetry "
                         "the simulator uses")
    count = sim_items(collective, algorithm, N)
    hosts = layout(N, ppn=ppn)
    mine = range(ppn) if ppn else range(1)  # host 0's ranks; one host: rank 0 for all
    # the ring and direct are alike under translation: rank r's round is rank 0's, each
    # peer shifted by r, so rank 0 runs and host 0's other ranks are its copies
    copies = range(1, len(mine)) if algorithm in TRANSLATED else range(0)
    reduced = [0] * N
    gens = {r: _generator(collective, algorithm, r, N, count, hosts if ppn else None, reduced)
            for r in (range(1) if copies else mine)}
    sent, received = dict.fromkeys(mine, 0), dict.fromkeys(mine, 0)  # bytes, per rank
    steps, out_total, in_total = [], 0, 0
    while gens:
        messages = []
        for r in list(gens):
            before = reduced[r]
            try:
                round_ = next(gens[r])
            except StopIteration:
                del gens[r]
                round_ = None
            if steps and reduced[r] > before:
                s = steps[-1]
                steps[-1] = s._replace(reduced=max(s.reduced, reduced[r] - before))
            for m in round_ or ():
                src, dst = (r, m.peer) if m.__class__ is Send else (m.peer, r)
                messages.append((src, dst, m.buf.nbytes, m.__class__ is Send))
                for c in copies:
                    messages.append(((src + c) % N, (dst + c) % N, m.buf.nbytes,
                                     m.__class__ is Send))
        if not messages:
            continue
        for src, dst, nbytes, is_send in messages:
            if is_send:
                sent[src] += nbytes
                out_total += nbytes if hosts[dst] != hosts[src] else 0
            else:
                received[dst] += nbytes
                in_total += nbytes if hosts[dst] != hosts[src] else 0
        steps.append(_symmetric_step(messages, hosts))
    return Schedule(collective, algorithm, N, ppn, count, tuple(steps),
                    (min(sent.values()), max(sent.values())),
                    (min(received.values()), max(received.values())),
                    max(out_total, in_total) if ppn else 0, "symmetry")


def _symmetric_step(messages, hosts) -> Step:
    """A `Step` from the messages host 0's ranks post: each counted once, on its poster's side."""
    sends, recvs, port_out, port_in = {}, {}, {}, {}
    out = into = 0
    across = False
    for src, dst, nbytes, is_send in messages:
        me = src if is_send else dst
        crosses = hosts[src] != hosts[dst]
        across = across or crosses
        if is_send:
            sends[me] = sends.get(me, 0) + 1
            if crosses:
                out += nbytes
            else:
                port_out[me] = port_out.get(me, 0) + nbytes
        else:
            recvs[me] = recvs.get(me, 0) + 1
            if crosses:
                into += nbytes
            else:
                port_in[me] = port_in.get(me, 0) + nbytes
    most = max([0, *sends.values(), *recvs.values()])
    return Step(most, across, max([0, *port_out.values(), *port_in.values()]), max(out, into),
                0)


def schedule(collective: str, algorithm: str, N: int, ppn: int = 0,
             cache: dict | None = None) -> Schedule:
    """`by_symmetry` where the schedule allows it, else `full` (to `FULL_LIMIT` ranks)."""
    key = (collective, algorithm, N, ppn)
    if cache is not None and key in cache:
        return cache[key]
    found = (by_symmetry if symmetric(collective, algorithm, N, ppn) else full)(
        collective, algorithm, N, ppn)
    if cache is not None:
        cache[key] = found
    return found
