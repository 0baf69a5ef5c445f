"""Binomial-tree broadcast and reduce, the naive all-reduce built from them, and
the scatter + all-gather broadcast for large messages.

Ranks are renumbered relative to the root, v = (rank - root) mod N. A rank
receives from v minus its lowest set bit, then forwards to v + mask for every
mask below that bit, largest first; the number of ranks holding the data
doubles each step. For N = 8, root 0:

        step 0:   0 ------------------> 4
        step 1:   0 --------> 2         4 --------> 6
        step 2:   0 -> 1      2 -> 3    4 -> 5      6 -> 7

A rank sends to one child a round, as in the picture, so N ranks take ⌈log2 N⌉
steps (N = 3 too: the root sends to 2, then to 1), the cost's count of message
times. The tables are computed by running this code (`mpidp.sim`): "→2:0-3"
sends blocks 0-3, the whole vector, to rank 2. For N = 4 and N = 3, root 0:

        $ python -m mpidp.sim table binomial --collective bcast --ranks 4
        step | rank 0 | rank 1 | rank 2 | rank 3
        -----+--------+--------+--------+-------
           0 | →2:0-3 |        | ←0:0-3 |
           1 | →1:0-3 | ←0:0-3 | →3:0-3 | ←2:0-3

        $ python -m mpidp.sim table binomial --collective bcast --ranks 3
        step | rank 0 | rank 1 | rank 2
        -----+--------+--------+-------
           0 | →2:0-2 |        | ←0:0-2
           1 | →1:0-2 | ←0:0-2 |

Reduce is the same tree run backwards: a rank receives from v + 1, v + 2,
v + 4, ... (its children, nearest first), adds each in, then sends the sum to
its parent. Naive all-reduce = reduce to rank 0, then broadcast from it: every
message carries the whole vector, and rank 0 reduces log2 N of them.

        $ python -m mpidp.sim table naive --ranks 4
        step | rank 0 | rank 1 | rank 2 | rank 3
        -----+--------+--------+--------+-------
           0 | ←1:0-3 | →0:0-3 | ←3:0-3 | →2:0-3
           1 | ←2:0-3 |        | →0:0-3 |
           2 | →2:0-3 |        | ←0:0-3 |
           3 | →1:0-3 | ←0:0-3 | →3:0-3 | ←2:0-3

Scatter + all-gather (van de Geijn): the same tree, but a message carries only
the blocks of the subtree below the receiver (half, then a quarter, ...), so
rank v ends with block v; a ring all-gather then completes every copy, each
rank starting as soon as it has its block:

        $ python -m mpidp.sim table scatter_allgather --collective bcast --ranks 4
        step | rank 0      | rank 1    | rank 2    | rank 3
        -----+-------------+-----------+-----------+----------
           0 | →2:2-3 →1:1 | ←0:1      | ←0:2-3    |
           1 | →1:0        | ←0:0      | →3:3      | ←2:3
           2 | ←3:3        | →2:1      | →3:2 ←1:1 | →0:3 ←2:2
           3 | →1:3 ←3:2   | →2:0 ←0:3 | →3:1 ←1:0 | →0:2 ←2:1
           4 | →1:2 ←3:1   | →2:3 ←0:2 | →3:0 ←1:3 | →0:1 ←2:0

Cost (G bytes, N ranks, L = ⌈log2 N⌉; α per message, β per byte, γ per
reduced byte):

    binomial broadcast:           L·α + L·G·β
    naive all-reduce:            2L·α + 2L·G·β + L·G·γ
    scatter_allgather broadcast:  (L + N - 1)·α + 2G(N-1)/N·β

The binomial tree is latency-optimal, so the choice for small messages; for large
ones the root's link carries the message L times, which scatter + all-gather avoids.
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, sections 4.1 and 4.4;
Barnett, Gupta, Payne, Shuler, van de Geijn, Watts, "Interprocessor collective
communication library (InterCom)", SHPCC 1994.
"""

from __future__ import annotations

from .blocks import Blocks
from .hosts import Links, spans_hosts
from .ops import Op
from .ring import ring_allgather
from .rounds import Cost, Recv, Rounds, Send


def binomial_bcast(comm, buf, root: int) -> Rounds:
    """Broadcast `buf` from `root` down a binomial tree."""
    rank, N = comm.Get_rank(), comm.Get_size()
    v = (rank - root) % N
    mask = 1
    while mask < N:  # find my parent: v with its lowest set bit cleared
        if v & mask:
            parent = (rank - mask) % N
            yield [Recv(buf, parent)]
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # forward to my children, farthest first, one a round
        if v + mask < N:
            yield [Send(buf, (rank + mask) % N)]
        mask >>= 1


def binomial_reduce(comm, buf, op: Op, tmp, root: int) -> Rounds:
    """Reduce `buf` onto `root` up a binomial tree; other ranks' `buf` is left partly reduced.

    Args:
        tmp: scratch of ``buf.size`` items, one child's vector.
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    v = (rank - root) % N
    mask = 1
    while mask < N:
        if v & mask:  # my subtree is complete: hand it to my parent
            yield [Send(buf, (rank - mask) % N)]
            return
        if v + mask < N:  # add in the subtree of my child v + mask
            yield [Recv(tmp, (rank + mask) % N)]
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
    rank, N = comm.Get_rank(), comm.Get_size()
    v = (rank - root) % N
    rel = Blocks.even(buf.size, N)  # block v is for relative rank v
    mask = 1
    while mask < N:  # receive my subtree's blocks v .. v + mask - 1 from my parent
        if v & mask:
            yield [Recv(buf[rel.span(v, min(v + mask, N))], (rank - mask) % N)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:  # give each child the blocks of its subtree
        if v + mask < N:
            sends.append(Send(buf[rel.span(v + mask, min(v + 2 * mask, N))], (rank + mask) % N))
        mask >>= 1
    if sends:
        yield sends
    # the ring runs on real ranks: rank q owns relative block q - root
    order = [(q - root) % N for q in range(N)]
    blocks = Blocks([rel.counts[b] for b in order], [rel.displs[b] for b in order])
    yield from ring_allgather(comm, buf, blocks)


# ------------------------------------------------------------ the cost (the docstring's lines)


def binomial_cost(N: int, G: float, hosts=None) -> Cost:
    L = (N - 1).bit_length()  # ⌈log2 N⌉
    return Cost(L, L * G, 0.0)


def naive_cost(N: int, G: float, hosts=None) -> Cost:
    L = (N - 1).bit_length()
    link = 0.0
    if spans_hosts(hosts):  # a binomial tree from rank 0: G up each edge, G down
        links = Links(hosts)
        for v in range(1, N):
            parent = v - (v & -v)
            links.send(v, parent, G)
            links.send(parent, v, G)
        link = links.busiest
    return Cost(2 * L, 2 * L * G, L * G, link)


def scatter_allgather_cost(N: int, G: float, hosts=None) -> Cost:
    L = (N - 1).bit_length()
    return Cost(L + N - 1, 2 * G * (N - 1) / N, 0.0)
