"""The simulator's checks of a round: what MPI would reject or leave undefined, said clearly.

`Sim` (`engine.py`) checks each message of a round as it posts it (a `Send` or a `Recv`,
a peer in range, a contiguous NumPy buffer) and, for a round of more than one message,
that no receive writes memory another message of the round reads or writes: MPI leaves
such a round undefined, and a real run would silently differ from the simulated one.
Each failed check raises a `ScheduleError` naming the step, the rank, the round and the
buffers (by the names the caller registered in ``sim.where``).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from mpidp.collectives.algorithms.rounds import Recv, Send

from .reports import ScheduleError, describe


def short(x) -> str:
    """repr(x), cut to a line."""
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def owner(buf: np.ndarray):
    """What owns `buf`'s memory (NumPy points every view's base at it): two views can
    overlap only if theirs is the same."""
    return buf if buf.base is None else buf.base


def bad_buffer(sim, step: int, rank: int, m) -> None:
    """The error for a message whose buffer is not a contiguous NumPy array."""
    buf = m.buf
    what = (f"a {type(buf).__name__}, not a NumPy array" if type(buf) is not np.ndarray
            else f"not contiguous (strides {buf.strides})")
    raise ScheduleError(f"step {step}: rank {rank}, round {sim.rounds[rank] - 1}: the "
                        f"{type(m).__name__}'s buffer is {what}; message buffers must be "
                        "contiguous NumPy arrays")


def check_round(sim, step: int, rank: int, round_) -> None:
    """No receive of a round may write memory that another message of it reads or writes.

    Only views of one array can overlap: the messages are grouped by the array that
    owns their memory, and only a group with a receive and another message is looked at.
    (Two messages: `Sim._run` checks them itself, with NumPy.)
    """
    groups: dict[int, list] = {}
    for m in round_:
        if m.buf.size:
            groups.setdefault(id(owner(m.buf)), []).append(m)
    for group in groups.values():
        if len(group) > 1 and any(type(m) is Recv for m in group):
            _check_spans(sim, step, rank, group)


def _check_spans(sim, step: int, rank: int, group: list) -> None:
    """The sweep of `check_round` over messages in one array: receives sorted by address."""
    spans = []
    for m in group:
        lo = m.buf.__array_interface__["data"][0]
        spans.append((lo, lo + m.buf.nbytes, m))
    writes = sorted((s for s in spans if type(s[2]) is Recv), key=lambda s: s[0])
    for x, y in zip(writes, writes[1:], strict=False):
        if y[0] < x[1]:
            overlap(sim, step, rank, x[2], y[2])
    starts = [s[0] for s in writes]
    for lo, hi, m in spans:
        if type(m) is Send:
            i = bisect_right(starts, hi - 1) - 1  # the last write starting below hi
            if i >= 0 and writes[i][1] > lo:
                overlap(sim, step, rank, m, writes[i][2])

def overlap(sim, step: int, rank: int, a, b):
    """The error for two messages of one round in the same memory."""
    raise ScheduleError(
        f"step {step}: rank {rank}, round {sim.rounds[rank] - 1}: {type(a).__name__} "
        f"{describe(sim.where[rank], a.buf)} (peer {a.peer}) and {type(b).__name__} "
        f"{describe(sim.where[rank], b.buf)} (peer {b.peer}) use the same memory: a round must not "
        "write into memory that another of its messages reads or writes")
