"""Placements, as the algorithms are handed them, and the bytes that cross between hosts.

A placement is a tuple with one host number per rank, hosts numbered 0, 1, ... in
the order of their first rank: ``(0, 0, 1, 1)`` is 2 hosts × 2 ranks numbered host
by host; None means one host. The call path learns it (collectives/placement.py)
and hands it to the algorithms that read it (the registry's ``placed``); they never
look it up themselves.
"""

from __future__ import annotations


def spans_hosts(hosts) -> bool:
    """True if the placement `hosts` puts the ranks on more than one host."""
    return hosts is not None and any(hosts)


def members(hosts) -> list[list[int]]:
    """members[h]: the ranks on host h, in rank order."""
    out = [[] for _ in range(max(hosts) + 1)]
    for q, h in enumerate(hosts):  # one pass: a host at a time would be N x hosts (16k ranks)
        out[h].append(q)
    return out


class Links:
    """Bytes through each host's link, out of it and into it, added up message by message."""

    __slots__ = ("hosts", "out", "into")

    def __init__(self, hosts):
        self.hosts = hosts
        self.out, self.into = [0.0] * (max(hosts) + 1), [0.0] * (max(hosts) + 1)

    def send(self, a: int, b: int, nbytes: float) -> None:
        """Rank a sends `nbytes` to rank b (nothing crosses if they share a host)."""
        if self.hosts[a] != self.hosts[b]:
            self.out[self.hosts[a]] += nbytes
            self.into[self.hosts[b]] += nbytes

    @property
    def busiest(self) -> float:
        """Bytes through the busiest link, in its busier direction."""
        return max(max(self.out), max(self.into))
