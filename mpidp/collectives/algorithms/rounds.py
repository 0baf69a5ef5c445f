"""Rounds: the words every algorithm yields.

An algorithm is a generator of rounds; a round is the list of messages that may be in
flight together, each a `Send` or a `Recv` of a contiguous array. The generator yields
a round and, when it resumes, the round is complete: it does the round's local work (a
reduction) and yields the next. Who posts the messages (MPI, the simulator, a byte
counter) is not the algorithm's business.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import NamedTuple


class Send(NamedTuple):
    """Send the array `buf` to rank `peer`."""

    buf: object
    peer: int
    outgoing = True  # (a class attribute, not a field) what staging copies out first


class Recv(NamedTuple):
    """Receive from rank `peer` into the array `buf`."""

    buf: object
    peer: int
    outgoing = False


Round = list  # of Send and Recv
Rounds = Generator[Round, None, None]


class Cost(NamedTuple):
    """What one call costs the busiest rank, in the terms of the α-β-γ model: the time is
    ``rounds·α + sent·β + reduced·γ`` (collectives/cost.py adds ``link·β_inter``)."""

    rounds: float  # rounds on the critical path (one α each)
    sent: float  # bytes sent by the busiest rank
    reduced: float  # bytes it reduces
    link: float | None = None  # bytes through the busiest host link, per direction (None:
    # not modelled for this algorithm)


def no_rounds() -> Rounds:
    """A collective with nothing to exchange (count 0)."""
    yield from ()


def copy_rounds(dst, src, algo=None, *args) -> Rounds:
    """Copy `src` into `dst`, then the rounds of ``algo(*args)`` if any.

    A copy the collective needs before its first round (one rank out of place, an
    all-gather's own block) belongs to every run of the plan, not to planning.
    """
    dst[...] = src
    if algo is not None:
        yield from algo(*args)


class Group:
    """What an algorithm sees of its communicator: its rank and the size.

    The simulator gives each rank one (as `SimComm`), and a loop that runs among some
    ranks only (a sub-group: no sub-communicator) gets one for its place in the group,
    its messages then addressed to the real ranks by `remap`.
    """

    __slots__ = ("rank", "size")

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def __getattr__(self, name):
        raise AttributeError(f"{type(self).__name__} has no {name!r}: an algorithm only reads "
                             "Get_rank()/Get_size() and yields rounds of Send/Recv")


def remap(rounds: Rounds, peers) -> Rounds:
    """The rounds of a loop among some ranks only, each message to peer p sent to
    ``peers[p]``, the real rank that plays p (a sub-group; the main loop of a fold)."""
    if tuple(peers) == tuple(range(len(peers))):  # the group is ranks 0, 1, ...: as they are
        return rounds
    return ([type(m)(m.buf, peers[m.peer]) for m in round_] for round_ in rounds)
