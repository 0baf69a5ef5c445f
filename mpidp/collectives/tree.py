"""Binomial-tree broadcast and reduce, the naive all-reduce built from them, and
the scatter + all-gather broadcast for large messages.

Ranks are renumbered relative to the root, v = (rank - root) mod N. A rank
receives from v minus its lowest set bit, then forwards to v + mask for every
mask below that bit, largest first; the number of ranks holding the data
doubles each step. For N = 8, root 0:

        step 0:   0 ------------------> 4
        step 1:   0 --------> 2         4 --------> 6
        step 2:   0 -> 1      2 -> 3    4 -> 5      6 -> 7

Table for N = 4 (root 0), "recv from / send to":

        rank | recv from | send to
        -----+-----------+---------
          0  |     -     |  2, 1
          1  |     0     |   -
          2  |     0     |   3
          3  |     2     |   -

Reduce is the same tree run backwards: a rank receives from v + 1, v + 2,
v + 4, ... (its children, nearest first), adds each in, then sends the sum to
its parent. Naive all-reduce = reduce to rank 0, then broadcast from it: every
message carries the whole vector, and rank 0 reduces log N of them.

Scatter + all-gather (van de Geijn): the same tree, but a message carries only
the blocks of the subtree below the receiver (half, then a quarter, ...), so
rank v ends with block v; a ring all-gather then completes every copy. For N = 4:

        scatter:  0 -> 2: blocks 2-3    then  0 -> 1: block 1,  2 -> 3: block 3
        ring all-gather: 3 steps, block v travels once around the ring

Cost (n bytes, p ranks, L = ⌈log2 p⌉):

    binomial broadcast:    L·α +  L·n·β
    naive all-reduce:     2L·α + 2L·n·β + L·n·γ
    scatter + all-gather: (L + p - 1)·α + 2n(p-1)/p·β

The binomial tree is latency-optimal, so the choice for small messages; for large
ones the root's link carries the message L times, which scatter + all-gather avoids.
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, sections 4.1 and 4.4;
Barnett, Gupta, Payne, Shuler, van de Geijn, Watts, "Interprocessor collective
communication library (InterCom)", SHPCC 1994.
"""

from __future__ import annotations

from .blocks import Blocks
from .ops import Op
from .ring import ring_allgather
from .schedule import Recv, Rounds, Send


def binomial_bcast(comm, buf, root: int) -> Rounds:
    """Broadcast `buf` from `root` down a binomial tree."""
    rank, n = comm.Get_rank(), comm.Get_size()
    v = (rank - root) % n
    mask = 1
    while mask < n:  # find my parent: v with its lowest set bit cleared
        if v & mask:
            parent = (rank - mask) % n
            yield [Recv(buf, parent)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:  # forward to my children, farthest first
        if v + mask < n:
            sends.append(Send(buf, (rank + mask) % n))
        mask >>= 1
    if sends:
        yield sends


def binomial_reduce(comm, buf, op: Op, tmp, root: int) -> Rounds:
    """Reduce `buf` onto `root` up a binomial tree; other ranks' `buf` is left partly reduced.

    Args:
        tmp: scratch of ``buf.size`` items, one child's vector.
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    v = (rank - root) % n
    mask = 1
    while mask < n:
        if v & mask:  # my subtree is complete: hand it to my parent
            yield [Send(buf, (rank - mask) % n)]
            return
        if v + mask < n:  # add in the subtree of my child v + mask
            yield [Recv(tmp, (rank + mask) % n)]
            op(buf, tmp)
        mask <<= 1


def naive_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: binomial reduce to rank 0, then binomial broadcast.

    `src`: the input, if it is not in `buf`; the tree reduces in place, so it is
    copied in first.
    """
    if src is not None:
        buf[...] = src
    yield from binomial_reduce(comm, buf, op, tmp, 0)
    if comm.Get_rank() == 0:
        op.finish(buf, comm.Get_size())
    yield from binomial_bcast(comm, buf, 0)


def scatter_allgather_bcast(comm, buf, root: int) -> Rounds:
    """Broadcast `buf` from `root`: binomial scatter of N blocks, then ring all-gather."""
    rank, n = comm.Get_rank(), comm.Get_size()
    v = (rank - root) % n
    rel = Blocks.even(buf.size, n)  # block v is for relative rank v
    mask = 1
    while mask < n:  # receive my subtree's blocks v .. v + mask - 1 from my parent
        if v & mask:
            yield [Recv(buf[rel.span(v, min(v + mask, n))], (rank - mask) % n)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:  # give each child the blocks of its subtree
        if v + mask < n:
            sends.append(Send(buf[rel.span(v + mask, min(v + 2 * mask, n))], (rank + mask) % n))
        mask >>= 1
    if sends:
        yield sends
    # the ring runs on real ranks: rank q owns relative block q - root
    order = [(q - root) % n for q in range(n)]
    blocks = Blocks([rel.counts[b] for b in order], [rel.displs[b] for b in order])
    yield from ring_allgather(comm, buf, blocks)
