"""The fold: how the power-of-two loops of halving.py and doubling.py run on any number of ranks N.

q = 2^floor(log2 N) ranks run the main loop, r = N - q do not. Ranks 2i and
2i+1 (i < r) pair up; the odd one takes part as virtual rank i and holds the
pair's data, the even one idles during the main loop and gets its result
afterwards. Ranks 2r.. are virtual ranks rank - r. For N = 6:

        rank     0   1   2   3   4   5          q = 4, r = 2
        virtual  -   0   -   1   2   3          ranks 0 and 2 idle
        (reduce-scatter and all-gather: virtual block i < r = blocks 2i, 2i+1)

The main loops address virtual ranks and ranges of virtual blocks, as they
would for N = q; ``remap(loop, real_ranks(q, r))`` sends each message to the
real rank that plays its peer, and `VirtualBlocks` maps a range of virtual
blocks to the real ones (a pair's two blocks are one virtual block).

Across hosts the order of the partners decides what crosses the host links
(`masks`): partners on one host first, so that the large halves stay inside the
hosts. In another order than the article's the all-reduce renumbers the blocks
(`owners`), so that each rank still keeps one run of them; a reduce-scatter
must end with block r on rank r (MPI's layout), so there a rank keeps every
other block (or every fourth ...), sent as several messages per round.

Cost (G bytes): in the reduction algorithms the pairs reduce a half each and
the even rank hands its reduced half over, 2α + G·β + G/2·γ before the main
loop (`fold_in`), and get the result back after it, α + G·β (α + G/N·β for
reduce-scatter: one block). Recursive doubling folds in one round,
α + G·β + G·γ, since it has a whole vector of scratch anyway; the all-gather
hands the even rank's block over (α + G/N·β) and all G back (α + G·β).
"""

from __future__ import annotations

from collections.abc import Generator
from functools import lru_cache
from typing import NamedTuple

from .blocks import Blocks
from .hosts import spans_hosts
from .ops import Op
from .rounds import Recv, Round, Send


def fold(N: int) -> tuple[int, int]:
    """(q, r): the largest power of two q <= N, and the r = N - q extra ranks."""
    q = 1 << (N.bit_length() - 1)
    return q, N - q


def virtual(rank: int, r: int) -> int:
    """The rank's number among the q ranks of the main loop (-1: it idles)."""
    if rank < 2 * r:
        return rank // 2 if rank % 2 else -1
    return rank - r


def real(vrank: int, r: int) -> int:
    """The rank that plays virtual rank `vrank`."""
    return 2 * vrank + 1 if vrank < r else vrank + r


@lru_cache(maxsize=256)
def real_ranks(q: int, r: int) -> tuple[int, ...]:
    """real_ranks[v]: the rank that plays virtual rank v, for `remap` of the main loop."""
    return tuple(real(v, r) for v in range(q))


@lru_cache(maxsize=256)
def masks(hosts: tuple | None, q: int, r: int, article: bool = False) -> tuple[int, ...]:
    """The halving order of partner masks for q = 2^k main-loop ranks (r folded pairs).

    The article's order is q/2, q/4, ..., 1 (partner at distance q/2 first). With a
    placement, the masks whose partners share a host come first (fewest pairs across
    hosts first, ties largest first): the halves that are still large are swapped
    inside the hosts, and only the small last pieces cross. On one host this is the
    article's order. Recursive doubling runs the order backwards.
    """
    order = [q >> i for i in range(1, q.bit_length())]  # q/2, ..., 1
    if article or not spans_hosts(hosts):
        return tuple(order)

    def crossing(mask: int) -> int:  # pairs of virtual ranks on two hosts
        return sum(hosts[real(v, r)] != hosts[real(v ^ mask, r)] for v in range(q))

    return tuple(sorted(order, key=lambda m: (crossing(m), -m)))


@lru_cache(maxsize=256)
def owners(order: tuple) -> tuple[int, ...]:
    """owner[b]: the rank whose block b is when halving in `order` keeps one run of blocks
    per rank (the upper half where the rank has the step's mask bit); the article's
    order gives block b to rank b."""
    q = 2 * max(order) if order else 1
    owner = [0] * q
    for v in range(q):
        owner[sum(q >> (i + 1) for i, m in enumerate(order) if v & m)] = v
    return tuple(owner)


class VirtualBlocks(NamedTuple):
    """The q blocks of the main loop over N blocks: virtual block v < r is the pair's
    two blocks 2v, 2v+1, the others one block each (v + r)."""

    blocks: Blocks
    r: int

    def edge(self, v: int) -> int:
        """The first real block of virtual block v."""
        return v + min(v, self.r)

    def span(self, lo: int, hi: int) -> slice:
        """Virtual blocks lo..hi-1 as a slice (packed blocks: they touch)."""
        return self.blocks.span(self.edge(lo), self.edge(hi))

    def runs(self, buf, lo: int, hi: int) -> list:
        """Virtual blocks lo..hi-1 of `buf` as views, neighbours that touch in memory merged."""
        return self.views(buf, range(lo, hi))

    def views(self, buf, vblocks) -> list:
        """The virtual blocks `vblocks` (ascending) of `buf` as views, those that touch merged."""
        views, start, end = [], None, None
        for i in (i for v in vblocks for i in range(self.edge(v), self.edge(v + 1))):
            d = self.blocks.displs[i]
            if d != end:
                if start is not None:
                    views.append(buf[start:end])
                start = d
            end = d + self.blocks.counts[i]
        if start is not None:
            views.append(buf[start:end])
        return views


def fold_in(buf, op: Op, tmp, rank: int, r: int, src, result) -> Generator[Round, None, object]:
    """The fold's prologue: ranks 2i, 2i+1 (i < r) each reduce half of the vector, the
    even one hands its half over and idles until its partner sends it `result`.

    `src` is the input (`buf` itself in place); the pair's sums go to `buf`; `result` is
    the view of `buf` the even rank gets back after the main loop. Returns (as
    ``src = yield from fold_in(...)``) what the main loop reads: `src` on the ranks
    outside the pairs, `buf` on the odd rank of a pair, None on the even one (done).
    """
    if rank >= 2 * r:
        return src
    half = buf.size // 2
    lower, upper = buf[:half], buf[half:]
    if rank % 2 == 0:
        yield [Send(src[half:], rank + 1), Recv(tmp[:half], rank + 1)]
        op(lower, tmp[:half], src[:half])
        yield [Send(lower, rank + 1)]
        yield [Recv(result, rank + 1)]  # idle through the main loop
        return None
    yield [Send(src[:half], rank - 1), Recv(tmp[: upper.size], rank - 1)]
    op(upper, tmp[: upper.size], src[half:])
    yield [Recv(lower, rank - 1)]  # the even rank's reduced half, taken as is
    return buf
