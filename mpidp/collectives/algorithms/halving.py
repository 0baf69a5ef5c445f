"""Recursive halving reduce-scatter, recursive doubling all-gather and all-reduce,
Rabenseifner all-reduce, and the fold that makes them work for any N.

Recursive halving (reduce-scatter), the article's figure: partners at distance
N/2 swap half of the vector, then partners at distance N/4 swap a quarter of
it, ... Each rank sends the half it gives away, receives its partner's copy of
the half it keeps and adds it in; after log2 N steps it keeps one block,
reduced over all ranks. For N = 4:

        step 0: mask 2     0 <----> 2        1 <----> 3          half the vector
        step 1: mask 1     0 <-> 1           2 <-> 3             a quarter

Recursive doubling (all-gather) is the mirror: partners at distance 1, 2, 4, ...
swap everything they hold, so what a rank holds doubles every step.
Rabenseifner all-reduce = recursive halving, then recursive doubling. The step
table is computed by running this code (`mpidp.sim`): "→2:2-3" sends blocks 2-3
to rank 2, "←2:0-1" receives blocks 0-1 from it, "↔1:0-3" does both with 0-3.

        $ python -m mpidp.sim table rabenseifner --ranks 4
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →2:2-3 ←2:0-1 | →3:2-3 ←3:0-1 | →0:0-1 ←0:2-3 | →1:0-1 ←1:2-3
           1 | →1:1 ←1:0     | →0:0 ←0:1     | →3:3 ←3:2     | →2:2 ←2:3
           2 | →1:0 ←1:1     | →0:1 ←0:0     | →3:2 ←3:3     | →2:3 ←2:2
           3 | →2:0-1 ←2:2-3 | →3:0-1 ←3:2-3 | →0:2-3 ←0:0-1 | →1:2-3 ←1:0-1

        after step 1 rank r holds block r reduced over all ranks

The reduce-scatter alone is steps 0-1, the all-gather alone steps 2-3:

        $ python -m mpidp.sim table recursive_halving --collective reduce_scatter --ranks 4
        (the table of `python -m mpidp.sim table rabenseifner --ranks 4` steps 0-1)

        $ python -m mpidp.sim table recursive_doubling --collective allgather --ranks 4
        (the table of `python -m mpidp.sim table rabenseifner --ranks 4` steps 2-3)

Across hosts the partner order decides what crosses the host links: with the
placement handed in (`hosts`), partners on one host come first (`fold.masks`),
so the large halves stay inside the hosts. For 2 hosts × 2 ranks (ranks 0, 1
on host 0, ranks 2, 3 on host 1) only quarters cross, in the rounds of the
hierarchical all-reduce; the article's order, whatever the placement, is
`rabenseifner_article`, and there the halves cross:

        $ python -m mpidp.sim table rabenseifner --ranks 4 --ppn 2
        (the table of `python -m mpidp.sim table hierarchical --ranks 4 --ppn 2`)

        $ python -m mpidp.sim table rabenseifner_article --ranks 4 --ppn 2
        (the table of `python -m mpidp.sim table rabenseifner --ranks 4`)

        $ python -m mpidp.sim table rabenseifner_article --ranks 4
        (the table of `python -m mpidp.sim table rabenseifner --ranks 4`)

Through a host's link per direction, for G bytes on 2 × 2: G nearest first,
2G in the article's order (`python -m mpidp.sim volume --ranks 4 --ppn 2`).

The recursive-doubling all-reduce swaps the whole vector with partner
rank ^ mask for mask = 1, 2, 4, ...: fewest rounds, most bytes. Both partners
add the same two vectors, in one order (the lower rank's first), so that every
rank gets the same bits: MAX of -0.0 and 0.0, or a sum of two NaNs, depends on
the order.

        $ python -m mpidp.sim table recursive_doubling --ranks 4
        step | rank 0 | rank 1 | rank 2 | rank 3
        -----+--------+--------+--------+-------
           0 | ↔1:0-3 | ↔0:0-3 | ↔3:0-3 | ↔2:0-3
           1 | ↔2:0-3 | ↔3:0-3 | ↔0:0-3 | ↔1:0-3

Any N: q = 2^floor(log2 N) ranks run the loops below, r = N - q fold into a
partner first and get their result from it after (fold.py). The main loops
(`_halving`, `_doubling`, `_swapping`) know nothing of the fold: they run on q
ranks and q blocks, as for N = q, and `remap` sends each message to the real
rank that plays its peer. `python -m mpidp.sim table rabenseifner --ranks 6`
prints the fold's steps.

Cost (G bytes, N ranks, q = 2^floor(log2 N), k = log2 q, f = 1 if N > q, else 0;
α per message, β per byte, γ per reduced byte; the f terms are the fold's, fold.py):

    recursive_halving reduce-scatter:
        kα + G(q-1)/q·β + G(q-1)/q·γ + f·(3α + Gβ + G/N·β + G/2·γ)
    recursive_doubling all-gather:
        kα + G(q-1)/q·β + f·(2α + G/N·β + Gβ)
    rabenseifner, rabenseifner_article all-reduce:
        2kα + 2G(q-1)/q·β + G(q-1)/q·γ + f·(3α + 2Gβ + G/2·γ)
    recursive_doubling all-reduce:
        k(α + Gβ + Gγ) + f·(2α + 2Gβ + Gγ)

Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, sections 4.4-4.5;
Rabenseifner, "Optimization of collective reduction operations", ICCS 2004.
"""

from __future__ import annotations

from .blocks import Blocks
from .fold import VirtualBlocks, fold, fold_in, masks, owners, real, real_ranks, virtual
from .hosts import Links, spans_hosts
from .ops import Op
from .rounds import Cost, Recv, Rounds, Send, remap


def halving_scratch(blocks: Blocks, N: int | None = None) -> int:
    """Scratch items for halving on `blocks` among N ranks (one block each): the larger
    first half (or fold half), whichever partner comes first (the placement decides)."""
    q, r = fold(len(blocks) if N is None else N)
    need = blocks.total - blocks.total // 2 if r else 0
    vblocks = VirtualBlocks(blocks, r)
    sizes = [vblocks.span(v, v + 1).stop - vblocks.span(v, v + 1).start for v in range(q)]
    for mask in masks(None, q, r):  # the first kept half, whichever mask comes first
        for side in (0, mask):
            need = max(need, sum(s for v, s in enumerate(sizes) if v & mask == side))
    return need


def rabenseifner_scratch(blocks: Blocks) -> int:
    """Scratch items for `rabenseifner_allreduce` of ``blocks.total`` items on len(blocks) ranks.

    The main loop's first kept half of q equal blocks, the larger blocks first, is at
    least half the vector, so it also covers the fold's half.
    """
    q = fold(len(blocks))[0]
    base, extra = divmod(blocks.total, q)
    return 0 if q == 1 else base * (q // 2) + min(extra, q // 2)


# ------------------------------------------- the main loops: q = 2^k ranks, q blocks


def _halving(rank: int, q: int, buf, blocks: VirtualBlocks, op: Op, tmp, src,
             masks: tuple, owner) -> Rounds:
    """Recursive halving among q ranks, partners in the order `masks`; ends with the
    block that rank `owner[block]` is `rank`, reduced over all of them.

    `src`: the input if it is not in `buf` (read in the first step only; buf gets the sums).
    With block b ending on rank b (owner = range(q)) in another order than the
    article's, a rank keeps every other block, ...: several messages per round.
    """
    mine = range(q)  # the blocks I am still reducing
    for mask in masks:
        partner = rank ^ mask
        send = [b for b in mine if owner[b] & mask != rank & mask]  # they end on its side
        mine = [b for b in mine if owner[b] & mask == rank & mask]
        kept, at, recv = blocks.pieces(buf, mine), 0, []
        for view in kept:  # the partner's copies of them, one after the other in tmp
            recv.append(tmp[at : at + view.size])
            at += view.size
        yield ([Send(v, partner) for v in blocks.pieces(src, send)]
               + [Recv(t, partner) for t in recv])
        for acc, t, mine_src in zip(kept, recv, blocks.pieces(src, mine), strict=True):
            op(acc, t, mine_src)  # my blocks += the partner's copies of them
        src = buf  # from the second step on, everything I send or add is in buf


def _doubling(rank: int, q: int, buf, blocks: VirtualBlocks, masks: tuple, owner) -> Rounds:
    """Recursive doubling among q ranks, `masks` backwards; starts with the block whose
    `owner` is `rank`, ends with all q blocks."""
    block_of = {v: b for b, v in enumerate(owner)}  # rank -> the block it ended with
    mine = [block_of[rank]]  # the blocks I hold
    for mask in reversed(masks):
        partner = rank ^ mask
        theirs = sorted(block_of[owner[b] ^ mask] for b in mine)  # as many, mirrored
        yield ([Send(v, partner) for v in blocks.pieces(buf, mine)]
               + [Recv(v, partner) for v in blocks.pieces(buf, theirs)])
        mine = sorted(mine + theirs)


def _swapping(rank: int, q: int, buf, op: Op, tmp, src) -> Rounds:
    """Recursive-doubling all-reduce among q ranks: swap the whole vector with rank ^ mask.

    Both partners compute the pair's sum, so both compute it in one order, the lower
    rank's vector first: in the other order MAX of -0.0 and 0.0, or the sum of two
    NaNs, gives other bits, and the ranks' results would differ.
    """
    mask = 1
    while mask < q:
        partner = rank ^ mask
        yield [Send(src, partner), Recv(tmp, partner)]
        mine, theirs = src, tmp
        if rank < partner:  # op(acc, b, a) leaves a ⊕ b in acc
            op(buf, theirs, mine)  # buf = mine ⊕ theirs
        else:
            op(buf, mine, theirs)  # buf = theirs ⊕ mine: the same bits as my partner's
        src = buf
        mask <<= 1


# ------------------------------------------------- the collectives: fold, loop, unfold


def recursive_halving_reduce_scatter(comm, buf, blocks: Blocks, op: Op, tmp, src=None,
                                     hosts=None) -> Rounds:
    """Reduce `buf` over all ranks in place; block `rank` ends complete.

    Args:
        blocks: packed blocks, one per rank (equal, or MPI_Reduce_scatter's recvcounts).
        tmp: scratch of ``halving_scratch(blocks)`` items (about half the vector).
        src: the input, if it is not in `buf` (out of place, N > 1): read, never written.
        hosts: the placement (the host of each rank; None: one host): the partner order.
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    q, r = fold(N)
    src = buf if src is None else src
    if rank < 2 * r:
        yield from fold_in(buf, op, tmp, rank, src)
        if rank % 2 == 0:  # idle until my partner sends my finished block
            yield [Recv(blocks.view(buf, rank), rank + 1)]
            return
        src = buf  # the pair's data is in buf now
    vrank, vblocks = virtual(rank, r), VirtualBlocks(blocks, r)
    order = masks(hosts, q, r)  # block v ends on virtual rank v, whatever the order
    yield from remap(_halving(vrank, q, buf, vblocks, op, tmp, src, order, range(q)),
                     real_ranks(q, r))
    op.finish(buf[vblocks.span(vrank, vrank + 1)], N)
    if rank < 2 * r:  # my partner's block, finished
        yield [Send(blocks.view(buf, rank - 1), rank - 1)]


def recursive_doubling_allgather(comm, buf, blocks: Blocks, hosts=None) -> Rounds:
    """Fill every block of `buf` from its owner; blocks may have any counts and displacements
    (`hosts`: the placement, as for the reduce-scatter)."""
    rank, N = comm.Get_rank(), comm.Get_size()
    q, r = fold(N)
    vblocks = VirtualBlocks(blocks, r)
    if rank < 2 * r and rank % 2 == 0:  # hand my block to my partner, get all back
        yield [Send(blocks.view(buf, rank), rank + 1)]
        yield [Recv(v, rank + 1) for v in vblocks.runs(buf, 0, q)]
        return
    if rank < 2 * r:
        yield [Recv(blocks.view(buf, rank - 1), rank - 1)]
    order = masks(hosts, q, r)
    yield from remap(_doubling(virtual(rank, r), q, buf, vblocks, order, range(q)),
                     real_ranks(q, r))
    if rank < 2 * r:
        yield [Send(v, rank - 1) for v in vblocks.runs(buf, 0, q)]


def rabenseifner_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None, hosts=None,
                           article: bool = False) -> Rounds:
    """All-reduce into `buf`: recursive halving, then recursive doubling, on q equal blocks.

    Args:
        blocks: ignored; the main loop splits the vector into q = 2^floor(log2 N) blocks.
        tmp: scratch of ``rabenseifner_scratch(blocks)`` items (about half the vector).
        src: the input, if it is not in `buf` (out of place, N > 1): read, never
            written; every item of `buf` is written by a sum or a receive, so the
            input is never copied.
        hosts: the placement (None: one host): partners on one host come first (`masks`).
        article: partners in the article's order (distance q/2 first) whatever the
            placement.
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    q, r = fold(N)
    src = buf if src is None else src
    if rank < 2 * r:
        yield from fold_in(buf, op, tmp, rank, src)
        if rank % 2 == 0:  # idle until my partner sends the result
            yield [Recv(buf, rank + 1)]
            return
        src = buf  # the pair's data is in buf now
    vrank, vblocks = virtual(rank, r), VirtualBlocks(Blocks.even(buf.size, q), 0)
    order = masks(hosts, q, r, article)
    owner = owners(order)  # any block may end anywhere: each rank's blocks stay one run
    peers = real_ranks(q, r)
    yield from remap(_halving(vrank, q, buf, vblocks, op, tmp, src, order, owner), peers)
    mine = owner.index(vrank)
    op.finish(buf[vblocks.span(mine, mine + 1)], N)
    yield from remap(_doubling(vrank, q, buf, vblocks, order, owner), peers)
    if rank < 2 * r:
        yield [Send(buf, rank - 1)]


def rabenseifner_article_allreduce(comm, buf, blocks: Blocks, op: Op, tmp,
                                   src=None) -> Rounds:
    """Rabenseifner in the article's order, partner at distance q/2 first, whatever the
    placement: across hosts numbered host by host, the large halves cross (see above)."""
    return rabenseifner_allreduce(comm, buf, blocks, op, tmp, src, article=True)


def recursive_doubling_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: swap the whole vector with partner rank ^ mask, log2 q rounds.

    Args:
        tmp: scratch of ``buf.size`` items, the partner's vector.
        src: the input, if it is not in `buf` (out of place, N > 1); read, never written.
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    q, r = fold(N)
    src = buf if src is None else src
    if rank < 2 * r and rank % 2 == 0:  # extra rank: hand my vector over, get the result back
        yield [Send(src, rank + 1)]
        yield [Recv(buf, rank + 1)]
        return
    if rank < 2 * r:
        yield [Recv(tmp, rank - 1)]
        op(buf, src, tmp)  # buf = the even rank's ⊕ mine, the lower rank's first
        src = buf
    yield from remap(_swapping(virtual(rank, r), q, buf, op, tmp, src), real_ranks(q, r))
    op.finish(buf, N)
    if rank < 2 * r:
        yield [Send(buf, rank - 1)]


# ------------------------------------------------------------ the cost (the docstring's lines)


def _terms(N: int, G: float):
    q, r = fold(N)
    return q, r, q.bit_length() - 1, float(r > 0), G * (q - 1) / q  # q, r, k, f, G(q-1)/q


def _link(N: int, G: float, hosts, whole: bool, article: bool = False) -> float | None:
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


def recursive_halving_cost(N: int, G: float, hosts=None) -> Cost:
    q, r, k, f, part = _terms(N, G)
    return Cost(k + 3 * f, part + f * (G + G / N), part + f * G / 2)


def recursive_doubling_allgather_cost(N: int, G: float, hosts=None) -> Cost:
    q, r, k, f, part = _terms(N, G)
    return Cost(k + 2 * f, part + f * (G / N + G), 0.0)


def rabenseifner_cost(N: int, G: float, hosts=None) -> Cost:
    q, r, k, f, part = _terms(N, G)
    return Cost(2 * k + 3 * f, 2 * part + f * 2 * G, part + f * G / 2,
                _link(N, G, hosts, whole=False))


def rabenseifner_article_cost(N: int, G: float, hosts=None) -> Cost:
    return rabenseifner_cost(N, G)._replace(link=_link(N, G, hosts, whole=False, article=True))


def recursive_doubling_cost(N: int, G: float, hosts=None) -> Cost:
    q, r, k, f, part = _terms(N, G)
    return Cost(k + 2 * f, k * G + f * 2 * G, k * G + f * G, _link(N, G, hosts, whole=True))
