"""Recursive-doubling all-reduce: swap the whole vector with partner rank ^ mask.

For mask = 1, 2, 4, ... each rank swaps its whole (partly reduced) vector with
partner rank ^ mask and adds the two: after log2 N steps every rank holds the sum.
Fewest rounds, most bytes. Both partners add the same two vectors, in one order
(the lower rank's first), so that every rank gets the same bits: MAX of -0.0 and
0.0, or a sum of two NaNs, depends on the order. For N = 4:

        step 0: mask 1     0 <-> 1           2 <-> 3             the whole vector
        step 1: mask 2     0 <----> 2        1 <----> 3          the whole vector

        $ python -m mpidp.sim table recursive_doubling --ranks 4
        step | rank 0 | rank 1 | rank 2 | rank 3
        -----+--------+--------+--------+-------
           0 | ↔1:0-3 | ↔0:0-3 | ↔3:0-3 | ↔2:0-3
           1 | ↔2:0-3 | ↔3:0-3 | ↔0:0-3 | ↔1:0-3

Any N: q = 2^floor(log2 N) ranks run the loop, the r = N - q extra ones fold into
a partner in one round (it has a whole vector of scratch) and get the result back
after it (fold.py).

Cost (G bytes, N ranks, q = 2^floor(log2 N), k = log2 q, f = 1 if N > q, else 0;
α per message, β per byte, γ per reduced byte):

    recursive_doubling all-reduce:
        k(α + Gβ + Gγ) + f·(2α + 2Gβ + Gγ)

Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, section 4.4.
"""

from __future__ import annotations

from .blocks import Blocks
from .fold import fold, real_ranks, virtual
from .nearest import link
from .ops import Op
from .rounds import Cost, Recv, Rounds, Send, remap


def swapping(rank: int, q: int, buf, op: Op, tmp, src) -> Rounds:
    """The loop among q = 2^k ranks: swap the whole vector with rank ^ mask, add.

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
    yield from remap(swapping(virtual(rank, r), q, buf, op, tmp, src), real_ranks(q, r))
    op.finish(buf, N)
    if rank < 2 * r:
        yield [Send(buf, rank - 1)]


def recursive_doubling_cost(N: int, G: float, hosts=None) -> Cost:
    q, r = fold(N)
    k, f = q.bit_length() - 1, float(r > 0)
    return Cost(k + 2 * f, k * G + f * 2 * G, k * G + f * G, link(N, G, hosts, whole=True))
