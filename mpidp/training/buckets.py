"""Gradient buckets: units whose gradients share one flat buffer and one reduction.

A model offers the protocol of `protocol.py` (units 1 .. U, ``names(i)``, the hooks).
A parameter named by several units (a tied weight: the GPT's token embedding,
written by its head, unit U, then added to by its embedding, unit 1) is
complete once the last of them in backward's order is done: it belongs to that
unit's bucket (`units`). Its buffer must exist from the first unit that writes
it (`writers`: what ZeRO stage 2 allocates before each unit).

The model's ``grads[name]`` become views into the buckets' buffers (PyTorch
DDP's gradient_as_bucket_view), so backward writes each gradient straight into
the buffer that is reduced, with no copy in or out.

Each backward, a bucket's ``request`` is one `Reduction`: the requests of its
parts (the whole bucket, or its pieces, `pieces.py`), started in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import collectives as mp


class Bucket:
    """Units whose gradients share one flat buffer and one reduction."""

    __slots__ = ("index", "units", "names", "flat", "pending", "plan", "request", "parts",
                 "spares", "planned_for")

    def __init__(self, index: int, units: list[int], names: list[str], flat):
        self.index, self.units, self.names, self.flat = index, units, names, flat
        self.pending = len(units)  # units not done yet in this backward
        self.plan = None  # its persistent reduction (mpidp.allreduce_init), made once
        # (deterministic: its ordered sum's, `determinism.persistent`, made anew if need be)
        self.request = None  # this backward's `Reduction`, once something of it started
        self.parts = []  # deterministic mode: the earlier micro-shards' gradients, kept
        self.spares = ()  # ... side by side: the fixed buffers of the first K - 1 (part_grads)
        self.planned_for = None  # ... the parts and result `plan` sums (average_parts)


class Reduction:
    """One backward's reduction of a bucket: its parts, each started once, in order.

    A part is a callable that starts a reduction and returns its request: one part for
    a whole bucket; one per piece for a bucket in pieces, started as backward writes
    them (``marks``: (unit, rows written) -> the part it completes). Request-like:
    ``Test()``, ``done``, ``rounds``; ``requests`` are the parts' started so far.
    """

    def __init__(self, parts: list[Callable], marks: dict | None = None):
        self.parts, self.marks = parts, marks or {}
        self.requests: list = []
        self.launched_at: list[float] = []

    def written(self, unit: int, rows: int) -> None:
        """Unit's first `rows` rows are written: start every part up to the one they complete."""
        k = self.marks.get((unit, rows))
        if k is not None:
            self._start(k + 1)

    def start(self) -> None:
        """Start every part not started yet."""
        self._start(len(self.parts))

    def _start(self, upto: int) -> None:
        for part in self.parts[len(self.requests):upto]:
            self.launched_at.append(time.perf_counter())
            self.requests.append(part())

    @property
    def done(self) -> bool:
        return len(self.requests) == len(self.parts) and all(r.done for r in self.requests)

    def test(self) -> bool:
        return mp.testall(self.requests) and len(self.requests) == len(self.parts)

    def Test(self, status=None) -> bool:  # noqa: N802 - as a request's, for mp.waitall
        return self.test()

    def __bool__(self) -> bool:
        return bool(self.requests)

    @property
    def rounds(self) -> int:
        """As one request's: 1 + the rounds past each part's first."""
        return 1 + sum(r.rounds - 1 for r in self.requests)

    @property
    def completed_at(self) -> float | None:
        ends = [r.completed_at for r in self.requests]
        return None if None in ends or not ends else max(ends)

    def times(self) -> list[tuple[float, float | None]]:
        """Each started part's launch and completion (perf_counter seconds)."""
        return [(t, r.completed_at) for t, r in zip(self.launched_at, self.requests, strict=True)]


def times(buckets: list[Bucket], nbytes, t0: float) -> list[dict]:
    """Each bucket reduced in the last backward: its launch and completion, seconds after
    `t0` (in pieces: its first piece's launch, its last one's completion, and ``pieces``:
    each piece's launch and completion), and its bytes (``nbytes(b)``)."""
    rows = []
    for b in buckets:
        if b.request is None or not b.request.done:
            continue
        row = {"bucket": b.index, "units": b.units, "bytes": nbytes(b),
               "launch": b.request.launched_at[0] - t0, "complete": b.request.completed_at - t0}
        if b.request.marks:
            row["pieces"] = [(s - t0, e - t0) for s, e in b.request.times()]
        rows.append(row)
    return rows


def units(m) -> list[tuple[int, list[str]]]:
    """Model `m`'s units in backward's order (U .. 1), each with the parameters it completes.

    Every parameter appears once: with the last unit, in backward's order, that names it.
    """
    last = {}
    for i in range(m.layers, 0, -1):
        for n in m.names(i):
            last[n] = i  # overwritten by every later unit of backward: the last one stays
    return [(i, [n for n in dict.fromkeys(m.names(i)) if last[n] == i])
            for i in range(m.layers, 0, -1)]


def writers(m, buckets: list[Bucket]) -> dict[int, list[Bucket]]:
    """Unit i -> the buckets holding a parameter it writes (backward) or reads (forward)."""
    where = {n: b for b in buckets for n in b.names}
    return {i: list({id(where[n]): where[n] for n in m.names(i)}.values())
            for i in range(1, m.layers + 1)}


def make_buckets(m, cap: float, first_cap: float) -> list[Bucket]:
    """Group model `m`'s units last-to-first into buckets; make its grads views of their buffers.

    A bucket closes once it holds `cap` bytes (the first one: `first_cap`), so
    its reduction can start as soon as backward has completed its last unit.
    """
    groups, group, size, held = [], [], 0, 0
    owned = dict(units(m))
    for i in owned:
        group.append(i)
        size += sum(m.grads[n].nbytes for n in owned[i])
        held += len(owned[i])
        if held and size >= (first_cap if not groups else cap):  # never a bucket of nothing
            groups.append(group)
            group, size, held = [], 0, 0
    if group and (held or not groups):
        groups.append(group)
    elif group:  # units that complete no parameter: their bucket waits for them too
        groups[-1].extend(group)
    buckets = []
    for k, group in enumerate(groups):
        names = [n for i in group for n in owned[i]]
        flat = m.xp.zeros(sum(m.grads[n].size for n in names), dtype=m.grads[names[0]].dtype)
        offset = 0
        for n in names:
            g = m.grads[n]
            view = flat[offset : offset + g.size].reshape(g.shape)  # no copy: a view
            view[...] = g
            m.grads[n] = view  # rebind in the same dict: the optimizer sees the view
            offset += g.size
        buckets.append(Bucket(k, group, names, flat))
    return buckets
