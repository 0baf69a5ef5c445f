"""Across hosts: the placement, the partner order it gives the halving family, the
placement-aware all-reduces (hierarchical among them) against MPI, the bytes through the
host links, and `auto`'s choice. (The hierarchical algorithm's own cases and cost
formula: test_hierarchical.py.)

The simulator runs N ranks in this process with any placement (fast); the MPI tests
run the same algorithms on real ranks of one machine, told a placement through
`CountingComm`, against the MPI library's own results (tests/helpers/oracle.py). The
emulated cluster's counters are asserted in tests/test_cluster.py.
"""

import numpy as np
import pytest
from helpers.oracle import (
    assert_same,
    make_input,
    native_allgather,
    native_allreduce,
    native_reduce_scatter,
)
from helpers.oracle import counts_for as oracle_counts
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off

from mpidp.collectives import CountingComm, api, cost, placement
from mpidp.collectives.algorithms import fold
from mpidp.collectives.state import state
from mpidp.sim import check, simulate
from mpidp.sim.volume import link_bytes, measure

PLACED = ("rabenseifner", "rabenseifner_article", "hierarchical", "recursive_doubling", "ring")
SHAPES = {  # placements as functions of N: equal hosts, unequal, interleaved
    "2 per host": lambda N: placement.layout(N, ppn=2),
    "3 per host": lambda N: placement.layout(N, ppn=3),
    "2 hosts": lambda N: placement.layout(N, hosts=2),
    "3 hosts": lambda N: placement.layout(N, hosts=3),
    "one per host": lambda N: placement.layout(N, ppn=1),
    "interleaved": lambda N: placement.normalize([(r * 7) % 3 for r in range(N)]),
}


# ------------------------------------------------------------------ simulated, any placement


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("collective,algorithm", [
    *(("allreduce", a) for a in PLACED), ("reduce_scatter", "recursive_halving"),
    ("allgather", "recursive_doubling")])
def test_every_placement_gives_the_right_result(collective, algorithm, shape):
    """N = 1..16, every count shape, op and dtype in turn, in and out of place; reduce-scatter
    still ends with block r on rank r (MPI's layout) whatever the partner order."""
    report = check(algorithm, collective, range(1, 17), quick=True, volume=False,
                   placement=SHAPES[shape])
    assert report.ok, report.text


def test_the_partner_order():
    assert fold.masks(None, 8, 0) == (4, 2, 1)  # one host: the article's order
    assert fold.masks((0,) * 8, 8, 0) == (4, 2, 1)
    assert fold.masks(placement.layout(4, ppn=2), 4, 0) == (1, 2)  # nearest first
    assert fold.masks(placement.layout(8, ppn=4), 8, 0) == (2, 1, 4)
    assert fold.masks(placement.layout(8, ppn=2), 8, 0, article=True) == (4, 2, 1)
    assert fold.owners((4, 2, 1)) == tuple(range(8))  # the article's: block b on rank b


def link(algorithm, hosts, count=48):
    """Bytes through the busiest host link, per direction, as a multiple of G (simulated)."""
    out = simulate("allreduce", algorithm, len(hosts), count, dtype="uint8", placement=hosts)
    return max(link_bytes(out.sim, hosts)) / count


def test_bytes_across_two_hosts_of_two_ranks():
    """The issue's figures, ranks numbered host by host: ring 1.5·G per direction, the
    article's order 2·G, nearest partner first G, hierarchical G (the lower bound)."""
    hosts = (0, 0, 1, 1)
    assert link("ring", hosts) == 1.5
    assert link("rabenseifner_article", hosts) == 2.0
    assert link("rabenseifner", hosts) == 1.0
    assert link("hierarchical", hosts) == 1.0
    assert link("rabenseifner", (0,) * 4) == 0  # one host: nothing crosses


@pytest.mark.parametrize("H,L", [(2, 1), (2, 3), (2, 4), (3, 2), (4, 2), (4, 4), (3, 3)])
def test_bytes_across_hosts_general_formula(H, L):
    """H hosts of L ranks: hierarchical 2G(H-1)/H per link and direction, the ring
    2G(N-1)/N (one ring edge leaves each host), the others as `cost.link_bytes` says."""
    hosts, N = placement.layout(H * L, ppn=L), H * L
    count = 2 * N * H * 16
    assert link("hierarchical", hosts, count) == pytest.approx(2 * (H - 1) / H)
    assert link("ring", hosts, count) == pytest.approx(2 * (N - 1) / N)
    for algorithm in ("rabenseifner", "rabenseifner_article", "recursive_doubling", "naive",
                      "direct", "hierarchical", "ring"):
        simulated = measure("allreduce", algorithm, N, hosts)["link"]
        assert simulated == pytest.approx(cost.link_bytes(algorithm, hosts, 1.0)), algorithm
    nearest, article = (link(a, hosts, count) for a in ("rabenseifner", "rabenseifner_article"))
    assert nearest <= article  # nearest first never sends more across than the article's order
    if L in (2, 4) and H in (2, 4):  # and, hosts of 2^k ranks, the halves stay on the host
        assert nearest == pytest.approx(2 * (H - 1) / H) and nearest < article


# ------------------------------------------------------------------ auto across hosts


def test_auto_takes_the_link_into_account():
    """A slow link between 2 hosts of 2: at large sizes `auto` takes hierarchical or
    nearest-first Rabenseifner (G across), not the ring (1.5·G) or the article's (2·G)."""
    names = api.ALGORITHMS["allreduce"][:-1]
    slow = cost.Model(alpha=15e-6, beta=0.5e-9, gamma=1e-9, beta_inter=40e-9)  # 25 MB/s
    hosts = placement.layout(4, ppn=2)
    for nbytes in (16 << 20, 64 << 20):
        assert cost.best(slow, "allreduce", names, nbytes, 4, hosts) in ("rabenseifner",
                                                                         "hierarchical")
        article = cost.predict(slow, "allreduce", "rabenseifner_article", nbytes, 4, hosts)
        ring = cost.predict(slow, "allreduce", "ring", nbytes, 4, hosts)
        best = cost.predict(slow, "allreduce", "hierarchical", nbytes, 4, hosts)
        assert ring > 1.4 * best and article > 1.9 * best
    # one host, or no link rate known: exactly today's choice and prediction
    flat = slow._replace(beta_inter=0.0)
    for nbytes in (8, 4096, 1 << 20, 64 << 20):
        for hosts_or_none in (None, (0,) * 4):
            assert cost.best(slow, "allreduce", names, nbytes, 4, hosts_or_none) == \
                cost.best(flat, "allreduce", names, nbytes, 4)
        for name in names:
            assert cost.predict(slow, "allreduce", name, nbytes, 4, (0,) * 4) == \
                cost.predict(flat, "allreduce", name, nbytes, 4)
    # the new names never win on one host: they tie with ring and rabenseifner, listed later
    for nbytes in (8, 1 << 16, 1 << 20, 1 << 26):
        for N in (2, 3, 4, 8):
            assert cost.best(flat, "allreduce", names, nbytes, N) not in (
                "hierarchical", "rabenseifner_article")


# ------------------------------------------------------------------ real ranks, told a placement


def check_against_mpi(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    for hosts in {placement.layout(n, ppn=2), placement.layout(n, hosts=3),
                  placement.layout(n, ppn=1), (0,) * n}:
        placed = CountingComm(comm, hosts)
        for i, count in enumerate(sorted({*oracle_counts(n), 101})):
            dtype, op = (("float64", "sum"), ("int32", "max"), ("int64", "avg"))[i % 3]
            dtype = "float64" if op == "avg" else dtype
            x = make_input(op, dtype, count, rank, seed=300)
            ref = native_allreduce(comm, x, op)
            for algorithm in ("hierarchical", "rabenseifner", "rabenseifner_article"):
                y = np.full_like(x, 7)
                api.allreduce(placed, x, y, op, algorithm=algorithm)
                assert_same(y, ref, f"{algorithm} {hosts} {dtype} {op} count={count}")
                inplace = x.copy()
                api.allreduce(placed, api.IN_PLACE, inplace, op, algorithm=algorithm)
                assert_same(inplace, ref, f"{algorithm} {hosts} in place count={count}")
            counts = [(count + j) // n for j in range(n)]  # uneven recvcounts
            x = make_input("sum", "int64", sum(counts), rank, seed=301)
            want = native_reduce_scatter(comm, x, counts, "sum")
            out = np.full(counts[rank], 9, np.int64)
            api.reduce_scatter(placed, x, out, counts, algorithm="recursive_halving")
            assert_same(out, want, f"reduce_scatter {hosts} {counts}")
            mine = make_input("sum", "int32", counts[rank], rank, seed=302)
            want = native_allgather(comm, mine, counts)
            got = np.full(sum(counts), 5, np.int32)
            api.allgather(placed, mine, got, counts, algorithm="recursive_doubling")
            assert_same(got, want, f"allgather {hosts} {counts}")


def check_bytes_across_hosts_counted(comm):
    """Bytes each host sends to the other host, counted per peer by CountingComm on real
    ranks told 2 hosts x 2 ranks: ring 1.5·G, article 2·G, nearest first G, hierarchical G."""
    hosts, rank = (0, 0, 1, 1), comm.Get_rank()
    x = np.ones(4800, np.float32)
    G = x.nbytes
    for algorithm, want in (("ring", 1.5), ("rabenseifner_article", 2.0),
                            ("rabenseifner", 1.0), ("hierarchical", 1.0)):
        counter = CountingComm(comm, hosts)
        api.allreduce(counter, api.IN_PLACE, x, algorithm=algorithm)
        across = sum(b for peer, b in counter.bytes_to.items() if hosts[peer] != hosts[rank])
        per_host = np.zeros(2, np.int64)
        comm.Allreduce(np.array([across * (hosts[rank] == 0), across * (hosts[rank] == 1)],
                                np.int64), per_host)
        assert per_host.tolist() == [want * G, want * G], algorithm


def check_placement_is_learned_once(comm):
    """On one machine every rank shares memory: one host; learned once, kept in the state."""
    n = comm.Get_size()
    dup = comm.Dup()
    try:
        assert state(dup).placement is None
        x = np.arange(10.0)
        api.allreduce(dup, api.IN_PLACE, x, algorithm="hierarchical")  # learns it
        assert state(dup).placement == (0,) * n
        assert placement.known(CountingComm(dup)) == (0,) * n  # a wrapper sees its comm's
        assert np.array_equal(x, n * np.arange(10.0))
    finally:
        dup.Free()


def check_placed_algorithms_match_mpi(comm):
    check_against_mpi(comm)
    check_placement_is_learned_once(comm)


# One launch for N = 1..8 (a communicator of each size: tests/helpers/subcomms.py; each
# launch of ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[8], timeout=300)
def test_placed_algorithms_match_mpi_and_bytes_between_hosts_on_real_ranks(mpi_ranks):
    """Every placement against MPI (N = 1..8); bytes between hosts, counted (N = 4)."""
    on_each_size(range(1, 9), check_placed_algorithms_match_mpi)
    with debug_check_off():  # the agreement check's own messages would be counted
        on_each_size((4,), check_bytes_across_hosts_counted)
