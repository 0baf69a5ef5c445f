"""What the simulator says when a schedule goes wrong: where a buffer is, who waits for what."""

from __future__ import annotations

import numpy as np

from mpidp.collectives.algorithms.rounds import Send


class ScheduleError(Exception):
    """A schedule that would fail under MPI: deadlock, mismatched pair, overlapping round."""


def locate(where: dict, view) -> tuple[str, int, int] | None:
    """(name, start, stop) of `view` in one of the arrays of `where` ({name: array}), or None."""
    if type(view) is not np.ndarray:
        return None
    here = view.__array_interface__["data"][0]
    for name, base in where.items():
        if base is None or base.dtype.itemsize != view.dtype.itemsize:
            continue
        start = base.__array_interface__["data"][0]
        offset, rest = divmod(here - start, view.dtype.itemsize)
        if not rest and 0 <= offset and offset + view.size <= base.size:
            return name, offset, offset + view.size
    return None


def describe(where: dict, buf) -> str:
    """'4 × float64 in buf[4:8]': a buffer, for a report."""
    if type(buf) is not np.ndarray:
        return repr(buf)
    place = locate(where, buf)
    return f"{buf.size} × {buf.dtype}" + (f" in {place[0]}[{place[1]}:{place[2]}]" if place
                                           else "")


def deadlock(sim, step: int, finished: list, waiting: dict) -> str:
    """Which ranks are blocked, in which round, and what each of their messages waits for."""
    waits: dict[int, list[str]] = {}
    for key, queue in sorted(waiting.items(), key=lambda kv: kv[0]):
        src, dst = divmod(key, sim.size)
        for m, _ in queue:
            buf = m.buf
            if type(m) is Send:
                waits.setdefault(src, []).append(f"its Send of {describe(sim.where[src], buf)} "
                                                 f"to rank {dst} is never received")
            else:
                waits.setdefault(dst, []).append(f"its Recv into {describe(sim.where[dst], buf)}"
                                                 f" from rank {src} gets no message")
    blocked = [r for r in range(sim.size) if not finished[r]]
    done = ranges([r for r in range(sim.size) if finished[r]]) or "none"
    lines = [f"deadlock after step {step}: ranks {ranges(blocked)} of {sim.size} cannot "
             f"go on (finished: {done})"]
    for r in blocked[:12]:
        for what in waits.get(r, [])[:4]:
            lines.append(f"  rank {r}, round {sim.rounds[r] - 1}: {what}")
    if len(blocked) > 12:
        lines.append(f"  ... and {len(blocked) - 12} more blocked ranks")
    return "\n".join(lines)


def ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)
