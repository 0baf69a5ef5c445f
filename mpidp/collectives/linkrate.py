"""The host links' rate: seconds per byte through a host's link (the cost model's beta_inter).

On a communicator that spans hosts (`placement`), `cost.model` measures it once,
collectively, beside alpha, beta and gamma.
"""

from __future__ import annotations

import time

import numpy as np

from .algorithms.blocks import Blocks
from .algorithms.doubling import recursive_doubling_allreduce
from .algorithms.hosts import members
from .algorithms.ops import MAX
from .algorithms.rounds import Recv, Send
from .engine.driver import run
from .state import state

LINK_PROBE = 1 << 20  # bytes each rank sends across to time the host links


def calibrate_link(comm, hosts: tuple) -> float:
    """Seconds per byte through a host's link; collective, on a comm that spans hosts.

    Every rank sends LINK_PROBE bytes to the rank of the same local index on the next
    host and receives as much from the previous one, all at once, as the hierarchical
    all-reduce's step across does: a link carries ppn probes per direction. Three
    back to back after one that opens the connections (so that ranks that start
    apart do not time a probe already on its way), the slowest rank's time over
    the bytes of the busiest link.
    """
    rank, H = comm.Get_rank(), max(hosts) + 1
    on = members(hosts)
    j, h = on[hosts[rank]].index(rank), hosts[rank]
    right, left = on[(h + 1) % H], on[(h - 1) % H]
    buf, tmp = np.zeros(LINK_PROBE, np.uint8), np.empty(LINK_PROBE, np.uint8)

    def exchange(times: int):
        for _ in range(times):
            yield [*([Send(buf, right[j])] if j < len(right) else []),
                   *([Recv(tmp, left[j])] if j < len(left) else [])]

    st = state(comm)
    slot = st.take()
    try:
        tag = st.tag(slot)
        run(comm, exchange(1), tag)  # opens the connections
        t0 = time.perf_counter()
        run(comm, exchange(3), tag)
        mine, slowest = np.array([(time.perf_counter() - t0) / 3]), np.empty(1)
        run(comm, recursive_doubling_allreduce(comm, slowest, Blocks.even(1, comm.Get_size()),
                                               MAX, np.empty(1), mine), tag)
    finally:
        st.release(slot)
    return float(slowest[0]) / (LINK_PROBE * max(map(len, on)))
