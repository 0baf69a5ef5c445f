"""Hierarchical all-reduce: reduce-scatter within each host, all-reduce across hosts, all-gather
within each host.

Across hosts the link between them is the bottleneck, so every byte should cross
it once. The ranks of a host first reduce the vector among themselves (a ring
reduce-scatter: local rank j ends with slice j summed over its host); then the
ranks that hold the same slice, one per host, all-reduce it across the hosts (a
ring among them); then each host gathers its slices back (a ring all-gather).
For 2 hosts × 2 ranks, ranks numbered host by host:

        host 0: rank 0, rank 1               host 1: rank 2, rank 3

        1. within:  0 <-> 1 (halves)         2 <-> 3 (halves)      slice 0 on 0, 2; 1 on 1, 3
        2. across:  0 <=====================> 2                    slice 0, in halves
                    1 <=====================> 3                    slice 1, in halves
        3. within:  0 <-> 1 (slices)         2 <-> 3 (slices)

Slices: the vector is cut into P slices, P the most ranks on one host; on a host
of L ranks, local rank j holds slices jP/L .. (j+1)P/L - 1 (equal hosts: slice j),
so every slice has one holder on every host and the ranks of any placement take
part (unequal hosts too). The placement (`hosts`) is handed in by the caller. The
step table is computed by running this code (`mpidp.sim`; "→1:2-3" sends blocks
2-3 to rank 1, "←1:0-1" receives blocks 0-1 from it):

        $ python -m mpidp.sim table hierarchical --ranks 4 --ppn 2
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →1:2-3 ←1:0-1 | →0:0-1 ←0:2-3 | →3:2-3 ←3:0-1 | →2:0-1 ←2:2-3
           1 | →2:1 ←2:0     | →3:3 ←3:2     | →0:0 ←0:1     | →1:2 ←1:3
           2 | →2:0 ←2:1     | →3:2 ←3:3     | →0:1 ←0:0     | →1:3 ←1:2
           3 | →1:0-1 ←1:2-3 | →0:2-3 ←0:0-1 | →3:0-1 ←3:2-3 | →2:2-3 ←2:0-1

On one host step 2 has nothing to do, and the algorithm is the ring all-reduce:

        $ python -m mpidp.sim table hierarchical --ranks 4
        (the table of `python -m mpidp.sim table ring --ranks 4`)

Cost (G bytes, H hosts, P the most ranks on one host; the second half's α and β
are those across hosts; the reductions of step 2 are on G/P bytes per rank):

    hierarchical all-reduce:
        2(P-1)α + 2G(P-1)/P·β + G(P-1)/P·γ + 2(H-1)α + 2(G/P)(H-1)/H·β + (G/P)(H-1)/H·γ

for equal hosts. On unequal ones a rank of a smaller host holds several slices and
runs one ring across hosts for each, one after the other: with K the most slices
one rank holds (⌈P/L⌉ for the smallest host's L), 2(P-1) + 2K(H-1) rounds (3 + 2
ranks: 8), and the busiest rank's bytes (`hierarchical_cost` adds them up per rank);
and through each host's link, per direction, 2G(H-1)/H bytes: G for 2 hosts, the
lower bound (each host must receive the other's sums for the half it reduces,
then the other half's result), where the ring across 2 × 2 sends 1.5G and
Rabenseifner in the article's order 2G. Reference: Thakur, Rabenseifner, Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005
(section 4.4's all-reduce on each level); Jia et al., "Highly scalable deep
learning training system with mixed-precision" (2018), the hierarchical
all-reduce of data-parallel training.
"""

from __future__ import annotations

from .blocks import Blocks
from .hosts import members as host_members
from .hosts import spans_hosts
from .ops import Op, Wrapper
from .ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from .rounds import Cost, Group, Rounds, remap


class Unfinished(Wrapper):
    """`op` without `finish`: the sums of a phase are complete only after the last one."""

    __slots__ = ()

    def finish(self, block, n: int) -> None:
        pass


def hierarchical_allreduce(comm, buf, blocks: Blocks, op: Op, tmp, src=None,
                           hosts=None) -> Rounds:
    """All-reduce into `buf`: within hosts, across hosts, within hosts.

    Args:
        blocks: ignored; the vector is cut into slices per host (see above).
        tmp: scratch of ``buf.size`` items.
        src: the input, if it is not in `buf` (out of place, N > 1); read, never written.
        hosts: the placement, the host of each rank (None: one host).
    """
    rank, N = comm.Get_rank(), comm.Get_size()
    hosts = hosts or (0,) * N
    members = host_members(hosts)
    local = members[hosts[rank]]  # my host's ranks; I am local rank j
    L, j, P = len(local), local.index(rank), max(map(len, members))
    slices = Blocks.even(buf.size, P)
    bounds = [i * P // L for i in range(L + 1)]  # local rank i holds slices bounds[i] .. [i+1]-1
    mine = Blocks([slices.start(bounds[i + 1]) - slices.start(bounds[i]) for i in range(L)])

    def holder(host: list, p: int) -> int:  # the rank of `host` that holds slice p
        return host[((p + 1) * len(host) - 1) // P]

    partial = Unfinished(op)
    if L > 1:  # 1. within my host: local rank j gets its slices, summed over the host
        yield from remap(ring_reduce_scatter(Group(j, L), buf, mine, partial, tmp, src), local)
        src = None
    for p in range(bounds[j], bounds[j + 1]):  # 2. across hosts: each of my slices
        holders = [holder(host, p) for host in members]  # one rank per host
        slice, H = slices.view(buf, p), len(holders)
        yield from remap(ring_allreduce(Group(holders.index(rank), H), slice,
                                        Blocks.even(slice.size, H), partial, tmp,
                                        None if src is None else slices.view(src, p)), holders)
    op.finish(mine.view(buf, j), N)
    if L > 1:  # 3. within my host: everyone's slices
        yield from remap(ring_allgather(Group(j, L), buf, mine), local)


def hierarchical_cost(N: int, G: float, hosts=None) -> Cost:
    """The docstring's cost line, with α' = α and β' = β (cost.py prices the link apart):
    the rounds of the critical path, the bytes sent and reduced of the busiest rank."""
    sizes = [len(m) for m in host_members(hosts)] if hosts else [N]
    H, P = len(sizes), max(sizes)  # hosts, ranks on the largest host
    slice, sent, reduced, K = G / P, 0.0, 0.0, 1
    for L in sizes:
        held = [(i + 1) * P // L - i * P // L for i in range(L)]  # slices of each local rank
        K = max(K, *held)
        for j, k in enumerate(held):  # ring within (all but one block each way), K rings across
            within = 0.0 if L == 1 else G - held[(j + 1) % L] * slice
            sent = max(sent, (G - k * slice if L > 1 else 0.0) + within
                       + k * 2 * slice * (H - 1) / H)
            reduced = max(reduced, (G - held[j - 1] * slice if L > 1 else 0.0)
                          + k * slice * (H - 1) / H)
    link = 2 * G * (H - 1) / H if spans_hosts(hosts) else 0.0  # every slice's ring share, once
    return Cost(2 * (P - 1) + 2 * (H - 1) * K, sent, reduced, link)
