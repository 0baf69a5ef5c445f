"""Placement: which host each rank runs on, how it is learned, and what it costs across hosts.

A placement is a tuple with one host number per rank, hosts numbered 0, 1, ... in
the order of their first rank: ``(0, 0, 1, 1)`` is 2 hosts × 2 ranks numbered host
by host. It is learned once per communicator and kept in its `state.CommState`:

- an mpi4py communicator: ``Split_type(COMM_TYPE_SHARED)`` groups the ranks that
  share memory (a host), and an allgather of each group's leader (its lowest world
  rank) numbers them. Both are MPI collectives on the communicator (queries, not
  data), so `placement` runs them where every rank arrives in the same order: the
  planning of the first collective that needs it (`PLACED`, or `auto`), as
  `cost.calibrate` runs there, after the agreement check of MPIDP_DEBUG;
- a comm-like object says it with a ``placement`` attribute (`CountingComm`'s
  argument, the simulator's `SimComm`); None there means one host.

`known` reads it without communicating (the algorithms call it: they must never
start a collective of their own). `masks` turns it into the halving family's
partner order, and `link_bytes` into the bytes that cross the busiest host link.

What placement costs, 2 hosts × 2 ranks (ranks 0, 1 on host 0, ranks 2, 3 on
host 1). Rabenseifner with the nearest partner first: the halves stay on the
host, only quarters cross (here the same rounds as the hierarchical all-reduce):

        $ python -m mpidp.sim table rabenseifner --ranks 4 --ppn 2
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →1:2-3 ←1:0-1 | →0:0-1 ←0:2-3 | →3:2-3 ←3:0-1 | →2:0-1 ←2:2-3
           1 | →2:1 ←2:0     | →3:3 ←3:2     | →0:0 ←0:1     | →1:2 ←1:3
           2 | →2:0 ←2:1     | →3:2 ←3:3     | →0:1 ←0:0     | →1:3 ←1:2
           3 | →1:0-1 ←1:2-3 | →0:2-3 ←0:0-1 | →3:0-1 ←3:2-3 | →2:2-3 ←2:0-1

and in the article's order, partner at distance N/2 first: the halves cross.

        $ python -m mpidp.sim table rabenseifner_article --ranks 4 --ppn 2
        step | rank 0        | rank 1        | rank 2        | rank 3
        -----+---------------+---------------+---------------+--------------
           0 | →2:2-3 ←2:0-1 | →3:2-3 ←3:0-1 | →0:0-1 ←0:2-3 | →1:0-1 ←1:2-3
           1 | →1:1 ←1:0     | →0:0 ←0:1     | →3:3 ←3:2     | →2:2 ←2:3
           2 | →1:0 ←1:1     | →0:1 ←0:0     | →3:2 ←3:3     | →2:3 ←2:2
           3 | →2:0-1 ←2:2-3 | →3:0-1 ←3:2-3 | →0:2-3 ←0:0-1 | →1:2-3 ←1:0-1

Bytes through a host's link per direction, for a vector of G bytes
(`python -m mpidp.sim volume --ranks 4 --ppn 2`; tests/test_topology.py asserts
them): ring 1.5G, Rabenseifner in the article's order 2G, nearest first G,
hierarchical G (hierarchical.py), G being the lower bound for two hosts.
"""

from __future__ import annotations

from functools import lru_cache

from .state import state


def normalize(hosts) -> tuple[int, ...]:
    """Host labels (any hashable per rank) as 0, 1, ... in the order of first appearance."""
    seen: dict = {}
    return tuple(seen.setdefault(h, len(seen)) for h in hosts)


def layout(N: int, ppn: int | None = None, hosts: int | None = None) -> tuple[int, ...]:
    """The placement of N ranks numbered host by host: `ppn` per host (the last one may
    have fewer), or spread over `hosts` hosts as evenly as can be (larger hosts first)."""
    if ppn:
        return tuple(r // ppn for r in range(N))
    if hosts:
        return tuple(r * hosts // N for r in range(N))
    return (0,) * N


def known(comm) -> tuple[int, ...] | None:
    """The comm's placement if it is known (None: not learned, or one host); no messages."""
    try:
        return comm.placement  # a comm-like that carries its own (None: one host)
    except AttributeError:
        return state(comm).placement


def placement(comm) -> tuple[int, ...]:
    """The comm's placement, learned now if it is not known (collective on an MPI comm)."""
    found = known(comm)
    if found is not None or hasattr(comm, "placement"):
        return found if found is not None else (0,) * comm.Get_size()
    from mpi4py import MPI

    base = comm
    while not isinstance(base, MPI.Comm) and hasattr(base, "comm"):
        base = base.comm
    if not isinstance(base, MPI.Comm):  # a comm-like that wraps none and says nothing
        found = (0,) * comm.Get_size()
    else:
        host = base.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            leader = host.allreduce(MPI.COMM_WORLD.Get_rank(), op=MPI.MIN)
        finally:
            host.Free()
        found = normalize(base.allgather(leader))
    state(comm).placement = found
    return found


# per collective, the algorithms whose messages depend on where the ranks run: planning one
# learns the placement (once per communicator: a query, collective like auto's
# calibration), after the call's tag, so that MPIDP_DEBUG's agreement check comes first
PLACED = {"allreduce": ("rabenseifner", "hierarchical"),
          "reduce_scatter": ("recursive_halving",), "allgather": ("recursive_doubling",)}


def locate(comm, comm_state, collective: str, algorithm: str) -> None:
    """Learn the comm's placement if `algorithm` reads it and it is not known yet."""
    if comm_state.placement is None and algorithm in PLACED[collective]:
        placement(comm)


def spans_hosts(hosts) -> bool:
    return hosts is not None and any(hosts)


# ------------------------------------------------------------ the halving family's order


@lru_cache(maxsize=256)
def masks(hosts: tuple | None, q: int, r: int, article: bool = False) -> tuple[int, ...]:
    """The halving order of partner masks for q = 2^k main-loop ranks (r folded pairs).

    The article's order is q/2, q/4, ..., 1 (partner at distance q/2 first). With a
    placement, the masks whose partners share a host come first (fewest pairs across
    hosts first, ties largest first): the halves that are still large are swapped
    inside the hosts, and only the small last pieces cross. On one host this is the
    article's order. Recursive doubling runs the order backwards.
    """
    order = [q >> i for i in range(1, q.bit_length())]  # q/2, ..., 1
    if article or not spans_hosts(hosts):
        return tuple(order)

    def host(v: int) -> int:  # the host of the real rank that plays virtual rank v
        return hosts[2 * v + 1 if v < r else v + r]

    def crossing(mask: int) -> int:
        return sum(host(v) != host(v ^ mask) for v in range(q))

    return tuple(sorted(order, key=lambda m: (crossing(m), -m)))


@lru_cache(maxsize=256)
def owners(order: tuple) -> tuple[int, ...]:
    """owner[b]: the rank whose block b is when halving in `order` keeps one run of blocks
    per rank (the upper half where the rank has the step's mask bit); the article's
    order gives block b to rank b."""
    q = 2 * max(order) if order else 1
    owner = [0] * q
    for v in range(q):
        owner[sum(q >> (i + 1) for i, m in enumerate(order) if v & m)] = v
    return tuple(owner)


# ------------------------------------------------------------ bytes across host links


def link_bytes(algorithm: str, hosts, G: float) -> float:
    """Bytes through the busiest host link, in its busier direction, for an all-reduce of
    G bytes (the algorithms' ideal block sizes; 0 on one host)."""
    N = len(hosts)
    if not spans_hosts(hosts) or N < 2:
        return 0.0
    out, into = [0.0] * (max(hosts) + 1), [0.0] * (max(hosts) + 1)

    def send(a: int, b: int, nbytes: float) -> None:
        if hosts[a] != hosts[b]:
            out[hosts[a]] += nbytes
            into[hosts[b]] += nbytes

    if algorithm == "hierarchical":  # every host sends each piece's ring share once
        H = max(hosts) + 1
        for h in range(H):
            out[h] = into[h] = 2 * G * (H - 1) / H
    elif algorithm == "ring":
        for a in range(N):
            send(a, (a + 1) % N, 2 * G * (N - 1) / N)
    elif algorithm == "direct":
        for a in range(N):
            for b in range(N):
                if a != b:
                    send(a, b, G)
    elif algorithm == "naive":  # binomial tree from rank 0: G up each edge, G down
        for v in range(1, N):
            parent = v - (v & -v)
            send(v, parent, G)
            send(parent, v, G)
    else:  # the halving family, after the fold of ranks 2i, 2i+1 (i < r)
        q = 1 << (N.bit_length() - 1)
        r = N - q
        for i in range(r):
            whole = algorithm == "recursive_doubling"
            send(2 * i, 2 * i + 1, G if whole else G)  # half, then the other reduced half
            send(2 * i + 1, 2 * i, G if whole else 1.5 * G)  # half, then the result
        order = masks(tuple(hosts), q, r, algorithm == "rabenseifner_article")
        for v in range(q):
            a = 2 * v + 1 if v < r else v + r
            for step, mask in enumerate(order):
                w = mask ^ v
                b = 2 * w + 1 if w < r else w + r
                send(a, b, G if algorithm == "recursive_doubling" else 2 * G / (2 << step))
    return max(max(out), max(into))


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
    import time

    import numpy as np

    from .algorithms.blocks import Blocks
    from .algorithms.halving import recursive_doubling_allreduce
    from .algorithms.ops import MAX
    from .algorithms.rounds import Recv, Send
    from .engine.driver import run

    rank, H = comm.Get_rank(), max(hosts) + 1
    members = [[q for q in range(len(hosts)) if hosts[q] == h] for h in range(H)]
    j, h = members[hosts[rank]].index(rank), hosts[rank]
    right, left = members[(h + 1) % H], members[(h - 1) % H]
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
    return float(slowest[0]) / (LINK_PROBE * max(map(len, members)))
