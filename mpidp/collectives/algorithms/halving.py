"""Recursive halving reduce-scatter, recursive doubling all-gather, Rabenseifner all-reduce.

Recursive halving (reduce-scatter), the article's figure: partners at distance
N/2 swap half of the vector, then partners at distance N/4 swap a quarter of
it, ... Each rank sends the half it gives away, receives its partner's copy of
the half it keeps and adds it in; after log2 N steps it keeps one block,
reduced over all ranks. For N = 4:

        step 0: mask 2     0 <----> 2        1 <----> 3          half the vector
        step 1: mask 1     0 <-> 1           2 <-> 3             a quarter

The step table is computed by running this code (`mpidp.sim`): "→2:2-3" sends
blocks 2-3 to rank 2, "←2:0-1" receives blocks 0-1 from it:

        $ python -m mpidp.sim table recursive_halving --collective reduce_scatter --ranks 4
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →2:2-3 ←2:0-1 | →3:2-3 ←3:0-1 | →0:0-1 ←0:2-3 | →1:0-1 ←1:2-3
           1 | →1:1 ←1:0     | →0:0 ←0:1     | →3:3 ←3:2     | →2:2 ←2:3

        after step 1 rank r holds block r reduced over all ranks

Recursive doubling (all-gather) is the mirror: partners at distance 1, 2, 4, ...
swap everything they hold, so what a rank holds doubles every step:

        $ python -m mpidp.sim table recursive_doubling --collective allgather --ranks 4
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →1:0 ←1:1     | →0:1 ←0:0     | →3:2 ←3:3     | →2:3 ←2:2
           1 | →2:0-1 ←2:2-3 | →3:0-1 ←3:2-3 | →0:2-3 ←0:0-1 | →1:2-3 ←1:0-1

Rabenseifner all-reduce = recursive halving, then recursive doubling:

        $ python -m mpidp.sim table rabenseifner --ranks 4
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →2:2-3 ←2:0-1 | →3:2-3 ←3:0-1 | →0:0-1 ←0:2-3 | →1:0-1 ←1:2-3
           1 | →1:1 ←1:0     | →0:0 ←0:1     | →3:3 ←3:2     | →2:2 ←2:3
           2 | →1:0 ←1:1     | →0:1 ←0:0     | →3:2 ←3:3     | →2:3 ←2:2
           3 | →2:0-1 ←2:2-3 | →3:0-1 ←3:2-3 | →0:2-3 ←0:0-1 | →1:2-3 ←1:0-1

Any N: q = 2^floor(log2 N) ranks run the loops, r = N - q fold into a partner
first and get their result from it after (fold.py). The loops know nothing of the
fold: they run on q virtual ranks and q virtual blocks, as for N = q, and `remap`
sends each message to the real rank that plays its peer. `python -m mpidp.sim table
rabenseifner --ranks 6` prints the fold's steps. Across hosts the partners on one
host come first (nearest.py).

Cost (G bytes, N ranks, q = 2^floor(log2 N), k = log2 q, f = 1 if N > q, else 0;
α per message, β per byte, γ per reduced byte; the f terms are the fold's, fold.py):

    recursive_halving reduce-scatter:
        kα + G(q-1)/q·β + G(q-1)/q·γ + f·(3α + Gβ + G/N·β + G/2·γ)
    recursive_doubling all-gather:
        kα + G(q-1)/q·β + f·(2α + G/N·β + Gβ)
    rabenseifner, rabenseifner_article all-reduce:
        2kα + 2G(q-1)/q·β + G(q-1)/q·γ + f·(3α + 2Gβ + G/2·γ)

Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, sections 4.4-4.5;
Rabenseifner, "Optimization of collective reduction operations", ICCS 2004.
"""

from __future__ import annotations

from .blocks import Blocks
from .fold import VirtualBlocks, fold, fold_in, masks, owners, real_ranks, virtual
from .nearest import link, placed_doubling, placed_halving
from .ops import Op
from .rounds import Cost, Recv, Rounds, Send, remap

# ------------------------------------------------ the article's loops: q = 2^k ranks, q blocks


def halving(rank: int, q: int, buf, blocks: VirtualBlocks, op: Op, tmp, src) -> Rounds:
    """Recursive halving among q ranks: ends with block `rank` reduced over all of them.

    `src`: the input if it is not in `buf` (read in the first step only; buf gets the sums).
    """
    lo, hi = 0, q  # the blocks I am still reducing: lo..hi-1
    mask = q // 2
    while mask:
        partner = rank ^ mask
        mid = lo + mask
        if rank & mask:  # I keep the upper half, my partner the lower one
            send, lo = blocks.span(lo, mid), mid
        else:
            send, hi = blocks.span(mid, hi), mid
        keep = blocks.span(lo, hi)
        theirs = tmp[: keep.stop - keep.start]  # the partner's copy of my half
        yield [Send(src[send], partner), Recv(theirs, partner)]
        op(buf[keep], theirs, src[keep])  # my half += the partner's copy of it
        src = buf  # from the second step on, everything I send or add is in buf
        mask >>= 1


def doubling(rank: int, q: int, buf, blocks: VirtualBlocks) -> Rounds:
    """Recursive doubling among q ranks: starts with block `rank`, ends with all q."""
    lo, hi = rank, rank + 1  # the blocks I hold: lo..hi-1
    mask = 1
    while mask < q:
        partner = rank ^ mask
        theirs = lo ^ mask  # the partner holds as many, mirrored across the mask
        yield [Send(buf[blocks.span(lo, hi)], partner),
               Recv(buf[blocks.span(theirs, theirs + mask)], partner)]
        lo, hi = min(lo, theirs), max(hi, theirs + mask)
        mask <<= 1


def _halving(rank, q, buf, blocks, op, tmp, src, order, owner) -> Rounds:
    """The article's loop in its order, the nearest-first one in any other."""
    if order == masks(None, q, 0) and tuple(owner) == tuple(range(q)):
        return halving(rank, q, buf, blocks, op, tmp, src)
    return placed_halving(rank, q, buf, blocks, op, tmp, src, order, owner)


def _doubling(rank, q, buf, blocks, order, owner) -> Rounds:
    if order == masks(None, q, 0) and tuple(owner) == tuple(range(q)):
        return doubling(rank, q, buf, blocks)
    return placed_doubling(rank, q, buf, blocks, order, owner)


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
    src = yield from fold_in(buf, op, tmp, rank, r, buf if src is None else src,
                             blocks.view(buf, rank))
    if src is None:  # my partner sent my finished block
        return
    vrank, vblocks = virtual(rank, r), VirtualBlocks(blocks, r)
    order = masks(hosts, q, r)  # block v ends on virtual rank v, whatever the order
    yield from remap(_halving(vrank, q, buf, vblocks, op, tmp, src, order, range(q)),
                     real_ranks(q, r))
    op.finish(buf[vblocks.span(vrank, vrank + 1)], N)
    if rank < 2 * r:  # my partner's block, finished
        yield [Send(blocks.view(buf, rank - 1), rank - 1)]


def recursive_doubling_allgather(comm, buf, blocks: Blocks, hosts=None) -> Rounds:
    """Fill every block of `buf` from its owner; blocks may have any counts
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
    src = yield from fold_in(buf, op, tmp, rank, r, buf if src is None else src, buf)
    if src is None:  # my partner sent the result
        return
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
    placement: across hosts numbered host by host, the large halves cross (nearest.py)."""
    return rabenseifner_allreduce(comm, buf, blocks, op, tmp, src, article=True)


# ------------------------------------------------------------ scratch and cost


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


def _terms(N: int, G: float):
    q, r = fold(N)
    return q.bit_length() - 1, float(r > 0), G * (q - 1) / q  # k, f, G(q-1)/q


def recursive_halving_cost(N: int, G: float, hosts=None) -> Cost:
    k, f, part = _terms(N, G)
    return Cost(k + 3 * f, part + f * (G + G / N), part + f * G / 2)


def recursive_doubling_allgather_cost(N: int, G: float, hosts=None) -> Cost:
    k, f, part = _terms(N, G)
    return Cost(k + 2 * f, part + f * (G / N + G), 0.0)


def rabenseifner_cost(N: int, G: float, hosts=None) -> Cost:
    k, f, part = _terms(N, G)
    return Cost(2 * k + 3 * f, 2 * part + f * 2 * G, part + f * G / 2,
                link(N, G, hosts, whole=False))


def rabenseifner_article_cost(N: int, G: float, hosts=None) -> Cost:
    return rabenseifner_cost(N, G)._replace(link=link(N, G, hosts, whole=False, article=True))
