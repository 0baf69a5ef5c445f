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
