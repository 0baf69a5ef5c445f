"""The exact sum's direct path: every item's addends sent raw to the rank that owns it.

Rank j owns block j of the items (`Blocks.even`). Each rank sends block j of each of
its addends to rank j, as they are, in one round; rank j then holds every addend of
its items, and sums them where it is (the grid sum of `exact_steps.local_sum`: no MAX
pass, no words on the wire), and the all-reduce all-gathers the sums:

        rank 0: a0 a1 a2     rank 1: b0 b1 b2     rank 2: c0 c1 c2   (3 ranks, 1 addend each)
        round:    rank 0: a1 --> 1, a2 --> 2   rank 1: b2 --> 2, b0 --> 0   rank 2: c0, c1
        local:    rank j: s_j = exact(a_j, b_j, c_j)   (steps 1-3 of prerounding.py)
        then:     all-gather of s0 s1 s2 (the chosen algorithm's: ring, doubling)

A sum of parts first swaps how many parts each rank holds (one integer to every
peer), since a rank receives one message per part; the op path (one addend per rank)
skips that round. The bits are those of the words path: each item's grid, words and
rounding depend only on its addends and their number, and here they are computed by
the same code on one rank.

Cost (G bytes of the dtype, N ranks, h addends on the busiest rank, A the chosen
all-gather's cost): (N-1)·α + h·G(N-1)/N·β (+ (N-1)·α for the counts) + A(G). With one
addend per rank that is SUM's bytes, 2G(N-1)/N; the words path's is 2.25 times it.
Worth it while the addends are few per rank: `takes_direct` says when.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from .algorithms.blocks import Blocks
from .algorithms.grids import Grid
from .algorithms.rounds import Recv, Round, Rounds, Send

CHUNK = 1 << 18  # bytes of each addend summed together: a chunk's words and constants stay cached
MOST_PER_RANK = 3  # up to 3 addends a rank on average: h + 1 < 4.5 (the words path's bytes)


def takes_direct(g: Grid, ranks: int) -> bool:
    """Does an exact sum of this grid on `ranks` ranks take the direct path? Both paths
    give the same bits; the direct one moves fewer bytes while the addends are few."""
    return not g.plain and ranks > 1 and g.addends <= MOST_PER_RANK * ranks


def _head(s, k: int):
    """The scratch `s` (of `chunk_items` items, `direct_rounds`'s) cut to k items."""
    full = max(s.y.size, 1)
    return type(s)(*(a[: a.size * k // full] for a in s))


def chunk_items(count: int, dtype) -> int:
    """Items in a chunk (`CHUNK` bytes) of `dtype`, at most `count`: the local sum's scratch."""
    return min(count, max(CHUNK // np.dtype(dtype).itemsize, 1))


def direct_rounds(comm, parts, out, g: Grid, gather, s, recv, counts, local,
                  average: bool = False, reduce_scatter: Blocks | None = None,
                  held: list[int] | None = None) -> Rounds:
    """The direct path as one generator of rounds.

    Args:
        parts: this rank's addends (flat, the whole vector each); may include `out`.
        out: the result (all-reduce), or with `reduce_scatter` this rank's block.
        gather: the all-gather generator ``(comm, buf, blocks)`` (all-reduce only).
        s: the scratch of the local sum of this rank's block; `local` runs it
            (`exact_steps.local_sum`, or `ordered.local_ordered`, which takes the addends in
            rank order and each rank's parts in its list's order).
        recv: scratch of the dtype for the others' addends (`direct_items`);
        counts: N int64, each rank's number of parts.
        held: each rank's number of parts, where every rank knows them (the op path:
            one each); None: the ranks swap them first.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    blocks = reduce_scatter if reduce_scatter is not None else Blocks.even(out.size, n)
    if held is None:
        held = yield from swap_held(comm, len(parts), counts, g.addends)
    lo, c = blocks.displs[rank], blocks.counts[rank]
    round_, at = [], 0
    got = [[] for _ in range(n)]  # each rank's addends of my block, its parts in its order
    got[rank] = [x[lo:lo + c] for x in parts]
    for d in range(1, n):  # to rank + d, from rank - d: no rank is everyone's first peer
        to, frm = (rank + d) % n, (rank - d) % n
        if blocks.counts[to]:
            round_ += [Send(blocks.view(x, to), to) for x in parts]
        for _ in range(held[frm] if c else 0):
            got[frm].append(recv[at:at + c])
            round_.append(Recv(got[frm][-1], frm))
            at += c
    if round_:
        yield round_
    mine = [x for addends in got for x in addends]  # rank 0's, then rank 1's, ... (ordered.py)
    block = out if reduce_scatter is not None else out[lo:lo + c]
    step = max(chunk_items(c, out.dtype), 1)
    for a in range(0, c, step):  # a chunk at a time: its passes run in the cache
        b = min(a + step, c)
        local([x[a:b] for x in mine], block[a:b], g, _head(s, b - a), average)
    if reduce_scatter is None and n > 1:
        yield from gather(comm, out, blocks)


def swap_held(comm, mine: int, counts, addends: int) -> Generator[Round, None, list[int]]:
    """Each rank's number of parts, to every peer, in one round (`counts`: N int64);
    returns them, all ranks', or raises ValueError, on every rank alike, unless they
    add up to `addends`."""
    n, rank = comm.Get_size(), comm.Get_rank()
    counts[rank] = mine
    yield ([Send(counts[rank:rank + 1], (rank + d) % n) for d in range(1, n)] +
           [Recv(counts[q:q + 1], q) for q in ((rank - d) % n for d in range(1, n))])
    held = counts.tolist()
    if sum(held) != addends:
        by_rank = ", ".join(f"rank {q}: {h}" for q, h in enumerate(held))
        raise ValueError(f"the ranks hold {sum(held)} parts in all ({by_rank}), "
                         f"but addends={addends}")
    return held


def direct_items(g: Grid, blocks: Blocks, rank: int, held: int) -> int:
    """Items of the dtype this rank receives at most: every other addend's block."""
    return max(g.addends - held, 0) * blocks.counts[rank]
