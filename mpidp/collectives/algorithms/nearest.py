"""Recursive halving and doubling across hosts: partners on one host first.

halving.py's loops swap with the partner at distance q/2 first. Across hosts the
partner order decides what crosses the host links: with the placement handed in
(`hosts`), the masks whose partners share a host come first (`fold.masks`), so the
large halves stay inside the hosts. For 2 hosts × 2 ranks (ranks 0, 1 on host 0,
ranks 2, 3 on host 1) only quarters cross, in the rounds of the hierarchical
all-reduce; the article's order, whatever the placement, is `rabenseifner_article`,
and there the halves cross:

        $ python -m mpidp.sim table rabenseifner --ranks 4 --ppn 2
        (the table of `python -m mpidp.sim table hierarchical --ranks 4 --ppn 2`)

        $ python -m mpidp.sim table rabenseifner_article --ranks 4 --ppn 2
        (the table of `python -m mpidp.sim table rabenseifner --ranks 4`)

        $ python -m mpidp.sim table rabenseifner_article --ranks 4
        (the table of `python -m mpidp.sim table rabenseifner --ranks 4`)

Through a host's link per direction, for G bytes on 2 × 2: G nearest first,
2G in the article's order (`python -m mpidp.sim volume --ranks 4 --ppn 2`).

In another order than the article's a rank keeps the blocks that end on its side of
each mask. The all-reduce renumbers the blocks (`fold.owners`) so that each rank
still keeps one run of them; a reduce-scatter must end with block b on rank b (MPI's
layout), so there a rank keeps every other block (or every fourth, ...), sent as
several messages per round. The cost is halving.py's; `link` is the bytes through the
busiest host link.
"""

from __future__ import annotations

from .fold import VirtualBlocks, fold, masks, real
from .hosts import Links, spans_hosts
from .ops import Op
from .rounds import Recv, Rounds, Send


def placed_halving(rank: int, q: int, buf, blocks: VirtualBlocks, op: Op, tmp, src,
                   order: tuple, owner) -> Rounds:
    """Recursive halving among q ranks, partners in the order `order`; ends with the
    block b that rank `owner[b]` is `rank`, reduced over all of them.

    `src`: the input if it is not in `buf` (read in the first step only; buf gets the sums).
    """
    mine = range(q)  # the blocks I am still reducing
    for mask in order:
        partner = rank ^ mask
        send = [b for b in mine if owner[b] & mask != rank & mask]  # they end on its side
        mine = [b for b in mine if owner[b] & mask == rank & mask]
        kept, at, recv = blocks.views(buf, mine), 0, []
        for view in kept:  # the partner's copies of them, one after the other in tmp
            recv.append(tmp[at : at + view.size])
            at += view.size
        yield ([Send(v, partner) for v in blocks.views(src, send)]
               + [Recv(t, partner) for t in recv])
        for acc, t, mine_src in zip(kept, recv, blocks.views(src, mine), strict=True):
            op(acc, t, mine_src)  # my blocks += the partner's copies of them
        src = buf  # from the second step on, everything I send or add is in buf


def placed_doubling(rank: int, q: int, buf, blocks: VirtualBlocks, order: tuple,
                    owner) -> Rounds:
    """Recursive doubling among q ranks, `order` backwards; starts with the block whose
    `owner` is `rank`, ends with all q blocks."""
    block_of = {v: b for b, v in enumerate(owner)}  # rank -> the block it ended with
    mine = [block_of[rank]]  # the blocks I hold
    for mask in reversed(order):
        partner = rank ^ mask
        theirs = sorted(block_of[owner[b] ^ mask] for b in mine)  # as many, mirrored
        yield ([Send(v, partner) for v in blocks.views(buf, mine)]
               + [Recv(v, partner) for v in blocks.views(buf, theirs)])
        mine = sorted(mine + theirs)


def link(N: int, G: float, hosts, whole: bool, article: bool = False) -> float | None:
    """Bytes through the busiest host link of an all-reduce: the fold's pairs, then the
    main loop's partners in the order `masks` gives (`whole`: the whole vector each step)."""
    if not spans_hosts(hosts) or N < 2:
        return 0.0
    q, r = fold(N)
    links = Links(hosts)
    for i in range(r):  # the even rank sends half, then its reduced half; gets half, the result
        links.send(2 * i, 2 * i + 1, G)
        links.send(2 * i + 1, 2 * i, G if whole else 1.5 * G)
    for v in range(q):
        for step, mask in enumerate(masks(tuple(hosts), q, r, article)):
            links.send(real(v, r), real(v ^ mask, r), G if whole else 2 * G / (2 << step))
    return links.busiest
