"""Recursive halving reduce-scatter, recursive doubling all-gather and all-reduce,
Rabenseifner all-reduce, and the fold that makes them work for any N.

Recursive halving (reduce-scatter): partners at distance N/2 swap half of the
vector, then partners at distance N/4 swap a quarter of it, ... Each rank
sends the half it gives away, receives its partner's copy of the half it keeps
and adds it in; after log2 N steps it keeps one block, reduced over all ranks.
For N = 4 (blocks 0..3; "send / keep" block ranges):

        step 0: mask 2     0 <----> 2        1 <----> 3          half the vector
        step 1: mask 1     0 <-> 1           2 <-> 3             a quarter

        step | rank 0    | rank 1    | rank 2    | rank 3
        -----+-----------+-----------+-----------+-----------
          0  | 2-3 / 0-1 | 2-3 / 0-1 | 0-1 / 2-3 | 0-1 / 2-3
          1  |  1  /  0  |  0  /  1  |  3  /  2  |  2  /  3
        rank r now holds block r reduced over all ranks

Recursive doubling (all-gather) is the mirror: partners at distance 1, 2, 4, ...
swap everything they hold, so what a rank holds doubles every step.

        step | rank 0    | rank 1    | rank 2    | rank 3     "send / recv"
        -----+-----------+-----------+-----------+-----------
          0  |  0  /  1  |  1  /  0  |  2  /  3  |  3  /  2
          1  | 0-1 / 2-3 | 0-1 / 2-3 | 2-3 / 0-1 | 2-3 / 0-1

Rabenseifner all-reduce = recursive halving, then recursive doubling. The
recursive-doubling all-reduce instead swaps the whole vector with partner
rank ^ mask for mask = 1, 2, 4, ...: fewest rounds, most bytes.

Any N (the fold): p = 2^floor(log2 N) ranks run the loops above, r = N - p do
not. Ranks 2i and 2i+1 (i < r) pair up; the odd one takes part as virtual rank
i and holds the pair's data, the even one idles during the main loop and gets
its result afterwards. Ranks 2r.. are virtual ranks rank - r. For N = 6:

        rank     0   1   2   3   4   5          p = 4, r = 2
        virtual  -   0   -   1   2   3          ranks 0 and 2 idle
        (reduce-scatter and all-gather: virtual block i < r = blocks 2i, 2i+1)

Cost (n bytes, p = 2^k ranks; α per message, β per byte, γ per reduced byte):

    reduce-scatter (halving):     log p·α +  n(p-1)/p·β + n(p-1)/p·γ
    all-gather (doubling):        log p·α +  n(p-1)/p·β
    Rabenseifner all-reduce:    2 log p·α + 2n(p-1)/p·β + n(p-1)/p·γ
    recursive-doubling all-red.:  log p·α +  n log p·β  + n log p·γ

Bytes sent per rank (what tests/test_halving.py asserts; b = one rank's block):

    reduce-scatter:  main-loop ranks: n minus the virtual block they keep; the
                     fold adds, for the odd rank of a pair, n//2 items before and
                     its partner's block after; the even rank sends n (two halves)
                     in 3 rounds. Rounds: log p, or log p + 3 for an odd one.
    all-gather:      n(p-1)/p (equal blocks, r = 0); in all, the loop sends (p-1)·n
                     over all ranks; the even rank of a pair sends its block, the
                     odd one all n after the loop; rounds log p, log p + 2, and 2.
    Rabenseifner:    2n(p-1)/p (p dividing n); the odd rank of a pair also n//2 + n,
                     the even one n; rounds 2 log p, 2 log p + 3, and 3.
    rec. doubling:   n log p; the odd rank of a pair also n, the even one n;
                     rounds log p, log p + 2, and 2.

The fold costs the pairs 2α + n·β + n/2·γ before (each reduces a half, the
even one hands its half over) and α + n·β after (α + b·β for reduce-scatter);
recursive doubling folds in one round, α + n·β + n·γ, since it has a whole
vector of scratch anyway.
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, sections 4.4-4.5;
Rabenseifner, "Optimization of collective reduction operations", ICCS 2004.
"""

from __future__ import annotations

from .blocks import Blocks
from .ops import Op
from .schedule import Recv, Rounds, Send


def fold(n: int) -> tuple[int, int]:
    """(p, r): the largest power of two p <= n, and the r = n - p extra ranks."""
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def virtual(rank: int, r: int) -> int:
    """The rank's number among the p ranks of the main loop (-1: it idles)."""
    if rank < 2 * r:
        return rank // 2 if rank % 2 else -1
    return rank - r


def real(vrank: int, r: int) -> int:
    """The rank that plays virtual rank `vrank`."""
    return 2 * vrank + 1 if vrank < r else vrank + r


def _edge(vblock: int, p: int, blocks: Blocks) -> int:
    """First real block of virtual block `vblock` (n blocks: a pair's two blocks are one)."""
    return vblock + min(vblock, len(blocks) - p)


def _runs(buf, blocks: Blocks, lo: int, hi: int) -> list:
    """Blocks lo..hi-1 of `buf` as views, neighbours that touch in memory merged."""
    views, start, end = [], None, None
    for i in range(lo, hi):
        d = blocks.displs[i]
        if d != end:
            if start is not None:
                views.append(buf[start:end])
            start = d
        end = d + blocks.counts[i]
    if start is not None:
        views.append(buf[start:end])
    return views


def halving_scratch(blocks: Blocks, n: int) -> int:
    """Scratch items for halving on `blocks` among n ranks: the larger first half (or fold half)."""
    p, r = fold(n)
    need = blocks.total - blocks.total // 2 if r else 0
    if p > 1:
        mid = blocks.start(_edge(p // 2, p, blocks))
        need = max(need, mid, blocks.total - mid)
    return need


def rabenseifner_scratch(blocks: Blocks) -> int:
    """Scratch items for `rabenseifner_allreduce` of ``blocks.total`` items on len(blocks) ranks.

    The main loop's first kept half of p equal blocks, the larger blocks first, is at
    least half the vector, so it also covers the fold's half.
    """
    p = fold(len(blocks))[0]
    base, extra = divmod(blocks.total, p)
    return 0 if p == 1 else base * (p // 2) + min(extra, p // 2)


def _fold_in(buf, op: Op, tmp, rank: int, src) -> Rounds:
    """Ranks 2i, 2i+1 each reduce half of the vector; the even one hands its half over.

    `src` is the input (`buf` itself in place); the results go to `buf`.
    """
    half = buf.size // 2
    lower, upper = buf[:half], buf[half:]
    if rank % 2 == 0:
        yield [Send(src[half:], rank + 1), Recv(tmp[:half], rank + 1)]
        op(lower, tmp[:half], src[:half])
        yield [Send(lower, rank + 1)]
    else:
        yield [Send(src[:half], rank - 1), Recv(tmp[: upper.size], rank - 1)]
        op(upper, tmp[: upper.size], src[half:])
        yield [Recv(lower, rank - 1)]  # the even rank's reduced half, taken as is


def _halving(comm, buf, blocks: Blocks, op: Op, tmp, p: int, r: int, src=None) -> Rounds:
    """Main loop of recursive halving among p virtual ranks; ends with my virtual block reduced.

    `src`: the input if it is not in `buf` (read in the first step only; buf gets the sums).
    """
    src = buf if src is None else src
    vrank = virtual(comm.Get_rank(), r)
    lo, hi = 0, p  # the virtual blocks I am still reducing
    mask = p >> 1
    while mask:
        partner = real(vrank ^ mask, r)
        mid = lo + mask
        if vrank & mask:  # keep the upper half, give away the lower one
            send_lo, send_hi, lo = lo, mid, mid
        else:
            send_lo, send_hi, hi = mid, hi, mid
        send_block = src[blocks.span(_edge(send_lo, p, blocks), _edge(send_hi, p, blocks))]
        kept = blocks.span(_edge(lo, p, blocks), _edge(hi, p, blocks))
        recv = tmp[: buf[kept].size]
        yield [Send(send_block, partner), Recv(recv, partner)]
        op(buf[kept], recv, src[kept])  # my half += the partner's copy of it
        src = buf  # from the second step on, everything I send or add is in buf
        mask >>= 1


def _doubling(comm, buf, blocks: Blocks, p: int, r: int) -> Rounds:
    """Main loop of recursive doubling among p virtual ranks; starts with my virtual block."""
    vrank = virtual(comm.Get_rank(), r)
    lo = vrank  # I hold virtual blocks lo .. lo + mask - 1
    mask = 1
    while mask < p:
        partner = real(vrank ^ mask, r)
        plo = lo ^ mask  # the partner holds as many blocks, next to mine
        mine = _runs(buf, blocks, _edge(lo, p, blocks), _edge(lo + mask, p, blocks))
        theirs = _runs(buf, blocks, _edge(plo, p, blocks), _edge(plo + mask, p, blocks))
        yield [Send(v, partner) for v in mine] + [Recv(v, partner) for v in theirs]
        lo = min(lo, plo)
        mask <<= 1


def recursive_halving_reduce_scatter(comm, buf, blocks: Blocks, op: Op, tmp,
                                     src=None) -> Rounds:
    """Reduce `buf` over all ranks in place; block `rank` ends complete.

    Args:
        blocks: packed blocks, one per rank (equal, or MPI_Reduce_scatter's recvcounts).
        tmp: scratch of ``halving_scratch(blocks, n)`` items (about half the vector).
        src: the input, if it is not in `buf` (out of place, N > 1): read, never written.
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    p, r = fold(n)
    src = buf if src is None else src
    if rank < 2 * r:
        yield from _fold_in(buf, op, tmp, rank, src)
        if rank % 2 == 0:  # idle until my partner sends my finished block
            yield [Recv(blocks.view(buf, rank), rank + 1)]
            return
        src = buf  # the pair's data is in buf now
    yield from _halving(comm, buf, blocks, op, tmp, p, r, src)
    vrank = virtual(rank, r)
    op.finish(buf[blocks.span(_edge(vrank, p, blocks), _edge(vrank + 1, p, blocks))], n)
    if rank < 2 * r:
        yield [Send(blocks.view(buf, rank - 1), rank - 1)]


def recursive_doubling_allgather(comm, buf, blocks: Blocks) -> Rounds:
    """Fill every block of `buf` from its owner; blocks may have any counts and displacements."""
    rank, n = comm.Get_rank(), comm.Get_size()
    p, r = fold(n)
    everything = _runs(buf, blocks, 0, n)
    if rank < 2 * r and rank % 2 == 0:  # hand my block to my partner, get all back
        yield [Send(blocks.view(buf, rank), rank + 1)]
        yield [Recv(v, rank + 1) for v in everything]
        return
    if rank < 2 * r:
        yield [Recv(blocks.view(buf, rank - 1), rank - 1)]
    yield from _doubling(comm, buf, blocks, p, r)
    if rank < 2 * r:
        yield [Send(v, rank - 1) for v in everything]


def rabenseifner_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: recursive halving, then recursive doubling, on p equal blocks.

    Args:
        blocks: ignored; the main loop splits the vector into p = 2^floor(log2 n) blocks.
        tmp: scratch of ``rabenseifner_scratch(blocks)`` items (about half the vector).
        src: the input, if it is not in `buf` (out of place, N > 1): read, never
            written; every item of `buf` is written by a sum or a receive, so the
            input is never copied.
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    p, r = fold(n)
    src = buf if src is None else src
    if rank < 2 * r:
        yield from _fold_in(buf, op, tmp, rank, src)
        if rank % 2 == 0:  # idle until my partner sends the result
            yield [Recv(buf, rank + 1)]
            return
        src = buf  # the pair's data is in buf now
    vblocks = Blocks.even(buf.size, p)
    yield from _halving(comm, buf, vblocks, op, tmp, p, r, src)
    op.finish(vblocks.view(buf, virtual(rank, r)), n)
    yield from _doubling(comm, buf, vblocks, p, r)
    if rank < 2 * r:
        yield [Send(buf, rank - 1)]


def recursive_doubling_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: swap the whole vector with partner rank ^ mask, log p rounds.

    Args:
        tmp: scratch of ``buf.size`` items, the partner's vector.
        src: the input, if it is not in `buf` (out of place, N > 1); read, never written.
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    p, r = fold(n)
    src = buf if src is None else src
    if rank < 2 * r and rank % 2 == 0:  # extra rank: hand my vector over, get the result back
        yield [Send(src, rank + 1)]
        yield [Recv(buf, rank + 1)]
        return
    if rank < 2 * r:
        yield [Recv(tmp, rank - 1)]
        op(buf, tmp, src)
        src = buf
    vrank = virtual(rank, r)
    mask = 1
    while mask < p:
        partner = real(vrank ^ mask, r)
        yield [Send(src, partner), Recv(tmp, partner)]
        op(buf, tmp, src)  # both partners compute the same sum: a + b == b + a bit for bit
        src = buf
        mask <<= 1
    op.finish(buf, n)
    if rank < 2 * r:
        yield [Send(buf, rank - 1)]
