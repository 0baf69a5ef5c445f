"""The article's naive all-reduce: every rank sends its whole vector to every other rank.

One round: each rank posts N - 1 sends of its vector and N - 1 receives, one
per peer, then adds the N vectors up itself. It is the baseline the article
measures the others against: G·(N-1) bytes sent and received per rank, against
2·G·(N-1)/N for the ring.

        rank 0:  v0 --> ranks 1, 2, 3     v3, v2, v1 <-- ranks 3, 2, 1
        rank 1:  v1 --> ranks 2, 3, 0     v0, v3, v2 <-- ranks 0, 3, 2
        rank 2:  v2 --> ranks 3, 0, 1     v1, v0, v3 <-- ranks 1, 0, 3
        rank 3:  v3 --> ranks 0, 1, 2     v2, v1, v0 <-- ranks 2, 1, 0
                              (N = 4: 12 messages of a whole vector, in one round)

Every rank adds the vectors in rank order, v0 ⊕ v1 ⊕ ... ⊕ v(N-1), its own
at its place (copied into the scratch first), so every rank gets the same bits.
The step table, computed by running this code (`mpidp.sim`; "↔1,2,3:0-3" swaps
blocks 0-3, the whole vector, with ranks 1, 2 and 3, in that order: rank r sends
to r + 1, r + 2, ... and receives from r - 1, r - 2, ..., so that no rank is
every rank's first peer):

        $ python -m mpidp.sim table direct --ranks 4
        step | rank 0     | rank 1     | rank 2     | rank 3
        -----+------------+------------+------------+-----------
           0 | ↔1,2,3:0-3 | ↔2,3,0:0-3 | ↔3,0,1:0-3 | ↔0,1,2:0-3

Cost (G bytes, N ranks; α per message, β per byte, γ per reduced byte): the
N - 1 messages leave one port one after the other, so

    direct all-reduce:  (N-1)α + G(N-1)·β + G(N-1)·γ

Reference: the seed article's "naive" exchange; Thakur, Rabenseifner, Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005.
"""

from __future__ import annotations

from .blocks import Blocks
from .hosts import Links, spans_hosts
from .ops import Op
from .rounds import Cost, Recv, Rounds, Send


def direct_scratch(blocks: Blocks) -> int:
    """Scratch items for `direct_allreduce`: one vector per rank."""
    return blocks.total * len(blocks)


def direct_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None) -> Rounds:
    """All-reduce into `buf`: swap whole vectors with every other rank, then add them up.

    Args:
        blocks: only their total is used (the whole vector travels).
        tmp: scratch of ``direct_scratch(blocks)`` items, one vector per rank.
        src: the input, if it is not in `buf` (out of place): read, never written.
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    if N == 1:  # nothing to exchange (out of place, the caller has copied the input)
        return
    src = buf if src is None else src
    count = blocks.total
    vec = [tmp[q * count : (q + 1) * count] for q in range(N)]  # vec[q]: rank q's vector
    vec[rank][...] = src  # mine at its place, so every rank adds in the same order
    yield ([Send(src, (rank + i) % N) for i in range(1, N)]
           + [Recv(vec[(rank - i) % N], (rank - i) % N) for i in range(1, N)])
    op(buf, vec[1], vec[0])  # v0 ⊕ v1, then ⊕ v2, ... in rank order
    for q in range(2, N):
        op(buf, vec[q])
    op.finish(buf, N)


def direct_cost(N: int, G: float, hosts=None) -> Cost:
    link = 0.0
    if spans_hosts(hosts):  # every rank sends its whole vector to every other
        links = Links(hosts)
        for a in range(N):
            for b in range(N):
                if a != b:
                    links.send(a, b, G)
        link = links.busiest
    return Cost(N - 1, G * (N - 1), G * (N - 1), link)
