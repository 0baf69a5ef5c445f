"""Binomial-tree broadcast.

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

Cost (n bytes, p ranks): ⌈log2 p⌉ steps, each a whole message:
    ⌈log2 p⌉·α + ⌈log2 p⌉·n·β
Latency-optimal, so the choice for small messages; for large ones the root's
link carries the message log p times (see scatter + all-gather).
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, section 4.
"""

from __future__ import annotations

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
