"""Ring reduce-scatter, all-gather and all-reduce.

The N ranks form a ring; every rank sends only to its right neighbour and
receives only from its left one. The buffer is cut into N blocks (`Blocks`).

            +-------+   +-------+   +-------+   +-------+
        +-->| rank0 |-->| rank1 |-->| rank2 |-->| rank3 |--+
        |   +-------+   +-------+   +-------+   +-------+  |
        +--------------------------------------------------+
                     right = rank + 1,  left = rank - 1  (mod N)

Reduce-scatter: in step s, rank r sends block (r - s - 1) and receives block
(r - s - 2), which it adds to its own copy. A block starts at rank b + 1, picks
up one rank's contribution per hop, and after N - 1 hops ends, complete, on
rank b. Table for N = 4, "send/recv" block numbers:

        step | rank 0 | rank 1 | rank 2 | rank 3
        -----+--------+--------+--------+--------
          0  |  3 / 2 |  0 / 3 |  1 / 0 |  2 / 1
          1  |  2 / 1 |  3 / 2 |  0 / 3 |  1 / 0
          2  |  1 / 0 |  2 / 1 |  3 / 2 |  0 / 3
        rank r now holds block r reduced over all ranks

All-gather: in step s, rank r sends block (r - s) and receives block
(r - s - 1), storing it as is. Each complete block travels once around the ring.

        step | rank 0 | rank 1 | rank 2 | rank 3
        -----+--------+--------+--------+--------
          0  |  0 / 3 |  1 / 0 |  2 / 1 |  3 / 2
          1  |  3 / 2 |  0 / 3 |  1 / 0 |  2 / 1
          2  |  2 / 1 |  3 / 2 |  0 / 3 |  1 / 0

All-reduce = reduce-scatter, then all-gather, on the same buffer. Out of place,
step 0 sends my own block straight from sendbuf and each sum is written as
recvbuf = sendbuf + incoming, so the input is never copied: every item of recvbuf
is written once, by a sum or (all-gather) by a receive.

Cost (n bytes, p ranks; α per message, β per byte, γ per reduced byte): each
half sends and receives n(p-1)/p bytes per rank in p - 1 steps, so

    reduce-scatter:  (p-1)α +  n(p-1)/p·β + n(p-1)/p·γ
    all-gather:      (p-1)α +  n(p-1)/p·β
    all-reduce:     2(p-1)α + 2n(p-1)/p·β + n(p-1)/p·γ

the bandwidth-optimal all-reduce: D = 2·G·(N-1)/N bytes per rank, not 2·G·(N-1).
Reference: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009; baidu-research/baidu-allreduce.
"""

from __future__ import annotations

from .blocks import Blocks
from .ops import Op
from .schedule import Recv, Rounds, Send


def ring_reduce_scatter(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """Reduce `buf` over all ranks, in place; block `rank` of `buf` ends complete.

    Args:
        buf: the whole vector on this rank; other blocks are left partly reduced.
        tmp: scratch of at least ``blocks.max`` items, the incoming block.
        src: the input, if it is not in `buf` (out of place, N > 1): it is read,
            never written, and `buf` gets only sums, so no copy of it is made.
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    src = buf if src is None else src
    for step in range(n - 1):
        send_block = (rank - step - 1) % n
        recv_block = (rank - step - 2) % n
        send = blocks.view(src if step == 0 else buf, send_block)  # step 0: my own data
        recv = tmp[: blocks.counts[recv_block]]
        yield [Send(send, right), Recv(recv, left)]
        op(blocks.view(buf, recv_block), recv, blocks.view(src, recv_block))  # mine + partial
    op.finish(blocks.view(buf, rank), n)


def ring_allgather(comm, buf, blocks: Blocks) -> Rounds:
    """Fill every block of `buf` from the rank that owns it; block `rank` is this rank's."""
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send_block = (rank - step) % n
        recv_block = (rank - step - 1) % n
        yield [Send(blocks.view(buf, send_block), right), Recv(blocks.view(buf, recv_block), left)]


def ring_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: ring reduce-scatter, then ring all-gather (`src`: as above)."""
    yield from ring_reduce_scatter(comm, buf, blocks, op, tmp, src)
    yield from ring_allgather(comm, buf, blocks)
