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
rank b. All-gather: in step s, rank r sends block (r - s) and receives block
(r - s - 1), storing it as is; each complete block travels once around the ring.
All-reduce = reduce-scatter, then all-gather, on the same buffer. The step
table is computed by running this code (`mpidp.sim`): "→1:3" sends block 3 to
rank 1, "←3:2" receives block 2 from rank 3.

        $ python -m mpidp.sim table ring --ranks 4
        step | rank 0    | rank 1    | rank 2    | rank 3
        -----+-----------+-----------+-----------+----------
           0 | →1:3 ←3:2 | →2:0 ←0:3 | →3:1 ←1:0 | →0:2 ←2:1
           1 | →1:2 ←3:1 | →2:3 ←0:2 | →3:0 ←1:3 | →0:1 ←2:0
           2 | →1:1 ←3:0 | →2:2 ←0:1 | →3:3 ←1:2 | →0:0 ←2:3
           3 | →1:0 ←3:3 | →2:1 ←0:0 | →3:2 ←1:1 | →0:3 ←2:2
           4 | →1:3 ←3:2 | →2:0 ←0:3 | →3:1 ←1:0 | →0:2 ←2:1
           5 | →1:2 ←3:1 | →2:3 ←0:2 | →3:0 ←1:3 | →0:1 ←2:0

        after step 2 rank r holds block r reduced over all ranks

The reduce-scatter alone is steps 0-2, the all-gather alone steps 3-5:

        $ python -m mpidp.sim table ring --collective reduce_scatter --ranks 4
        (the table of `python -m mpidp.sim table ring --ranks 4` steps 0-2)

        $ python -m mpidp.sim table ring --collective allgather --ranks 4
        (the table of `python -m mpidp.sim table ring --ranks 4` steps 3-5)

Out of place, step 0 sends my own block straight from sendbuf and each sum is
written as recvbuf = sendbuf + incoming, so the input is never copied: every
item of recvbuf is written once, by a sum or (all-gather) by a receive.

Cost (G bytes, N ranks; α per message, β per byte, γ per reduced byte): each
half sends and receives G(N-1)/N bytes per rank in N - 1 steps, so

    ring reduce-scatter:  (N-1)α + G(N-1)/N·β + G(N-1)/N·γ
    ring all-gather:      (N-1)α + G(N-1)/N·β
    ring all-reduce:     2(N-1)α + 2G(N-1)/N·β + G(N-1)/N·γ

the bandwidth-optimal all-reduce: D = 2·G·(N-1)/N bytes per rank, not 2·G·(N-1).
Reference: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009; baidu-research/baidu-allreduce.
"""

from __future__ import annotations

from .blocks import Blocks
from .hosts import Links, spans_hosts
from .ops import Op
from .rounds import Cost, Recv, Rounds, Send


def ring_reduce_scatter(comm, buf, blocks: Blocks, op: Op, tmp, src=None,
                        out=None) -> Rounds:
    """Reduce `buf` over all ranks, in place; block `rank` of `buf` ends complete.

    Args:
        buf: the whole vector on this rank; other blocks are left partly reduced.
        tmp: scratch of at least ``blocks.max`` items, the incoming block.
        src: the input, if it is not in `buf` (out of place, N > 1): it is read,
            never written, and `buf` gets only sums, so no copy of it is made.
        out: where block `rank` ends, if not in `buf` (N > 1; the reduce-scatter's
            recvbuf): the last sum is written there, not copied there after.
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % N, (rank - 1) % N
    src = buf if src is None else src
    out = blocks.view(buf, rank) if out is None else out
    for step in range(N - 1):
        send_block = (rank - step - 1) % N
        recv_block = (rank - step - 2) % N  # the last step: my own block
        send = blocks.view(src if step == 0 else buf, send_block)  # step 0: my own data
        recv = tmp[: blocks.counts[recv_block]]
        yield [Send(send, right), Recv(recv, left)]
        mine = out if recv_block == rank else blocks.view(buf, recv_block)
        op(mine, recv, blocks.view(src, recv_block))  # mine + partial
    op.finish(out, N)


def ring_allgather(comm, buf, blocks: Blocks, src=None) -> Rounds:
    """Fill every block of `buf` from the rank that owns it; block `rank` is this rank's.

    src: my block, if it is not in `buf` yet (out of place): step 0 sends it from
    there, and it goes to its place after the last step. (Sending a block just
    copied is slower: the peer reads cache lines that are dirty in this core's
    cache; 77 against 49 µs for 512 KiB on 2 ranks, docs/benchmarks-notes.md.)
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % N, (rank - 1) % N
    for step in range(N - 1):
        send_block = (rank - step) % N
        recv_block = (rank - step - 1) % N
        send = src if step == 0 and src is not None else blocks.view(buf, send_block)
        yield [Send(send, right), Recv(blocks.view(buf, recv_block), left)]
    if src is not None:  # no step sends or receives my block after step 0
        blocks.view(buf, rank)[...] = src


def ring_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: ring reduce-scatter, then ring all-gather (`src`: as above)."""
    yield from ring_reduce_scatter(comm, buf, blocks, op, tmp, src)
    yield from ring_allgather(comm, buf, blocks)


# ------------------------------------------------------------ the cost (the docstring's lines)


def ring_reduce_scatter_cost(N: int, G: float, hosts=None) -> Cost:
    part = G * (N - 1) / N
    return Cost(N - 1, part, part)


def ring_allgather_cost(N: int, G: float, hosts=None) -> Cost:
    return Cost(N - 1, G * (N - 1) / N, 0.0)


def ring_allreduce_cost(N: int, G: float, hosts=None) -> Cost:
    part = G * (N - 1) / N
    link = 0.0
    if spans_hosts(hosts):  # every rank sends 2G(N-1)/N to its right neighbour
        links = Links(hosts)
        for a in range(N):
            links.send(a, (a + 1) % N, 2 * part)
        link = links.busiest
    return Cost(2 * (N - 1), 2 * part, part, link)
