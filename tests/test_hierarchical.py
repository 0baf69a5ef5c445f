"""The hierarchical all-reduce (reduce-scatter on each host, all-reduce across hosts, all-gather
on each host), in the simulator: every case on unequal hosts, and its cost formula.

Against the MPI library on real ranks told a placement, with the other placement-aware
algorithms, and the bytes through the host links: test_placement.py.
"""

import math

import pytest

from mpidp.collectives import cost, placement
from mpidp.sim import check, simulate


def test_hierarchical_passes_every_case_on_unequal_hosts():
    report = check("hierarchical", "allreduce", range(1, 9), volume=False,
                   placement=lambda N: placement.layout(N, hosts=3))
    assert report.ok, report.text


@pytest.mark.parametrize("H,L", [(2, 1), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3), (4, 2),
                                 (2, 4), (5, 2)])
def test_the_hierarchical_cost_formula_is_what_the_simulator_measures(H, L):
    """H hosts of L ranks: the cost model's rounds, bytes sent and bytes reduced (the
    formula of hierarchical.py, with its rounds across hosts) are the simulated critical
    path and busiest rank's, exactly (unequal hosts: the next test)."""
    hosts, N = placement.layout(H * L, ppn=L), H * L
    count = 2 * N * H * 16  # whole slices and blocks at every level
    s = simulate("allreduce", "hierarchical", N, count, dtype="int64", placement=hosts).sim
    G = count * 8
    unit = {"rounds": cost.Model(1, 0, 0), "bytes": cost.Model(0, 1, 0),
            "reduced": cost.Model(0, 0, 1)}
    formula = {k: cost.predict(m, "allreduce", "hierarchical", G, N, hosts)
               for k, m in unit.items()}
    simulated = {"rounds": s.steps, "bytes": max(s.bytes_sent), "reduced": max(s.reduced) * 8}
    assert formula == pytest.approx(simulated), (hosts, formula, simulated)
    assert formula["rounds"] == 2 * (L - 1) + 2 * (H - 1)


@pytest.mark.parametrize("sizes", [(3, 2), (2, 3), (3, 1), (1, 3), (2, 1), (4, 2), (4, 3),
                                   (5, 2), (5, 3), (3, 3, 1), (3, 2, 2), (4, 1, 1), (2, 2, 1),
                                   (4, 3, 2), (1, 2, 3, 1)])
def test_the_cost_formula_holds_on_unequal_hosts(sizes):
    """Hosts of unequal sizes (ranks host by host): a rank of a smaller host holds several
    slices and runs one ring across hosts for each, so the cost's rounds, bytes sent and
    bytes reduced are the simulated critical path's and busiest rank's (3 + 2 ranks: 8
    steps), not the largest host's alone."""
    hosts = tuple(h for h, L in enumerate(sizes) for _ in range(L))
    N, H, P = len(hosts), len(sizes), max(sizes)
    count = 2 * N * H * 16 * math.lcm(*range(1, P + 1))  # whole slices and blocks everywhere
    s = simulate("allreduce", "hierarchical", N, count, dtype="int64", placement=hosts).sim
    G = count * 8
    unit = {"rounds": cost.Model(1, 0, 0), "bytes": cost.Model(0, 1, 0),
            "reduced": cost.Model(0, 0, 1)}
    formula = {k: cost.predict(m, "allreduce", "hierarchical", G, N, hosts)
               for k, m in unit.items()}
    simulated = {"rounds": s.steps, "bytes": max(s.bytes_sent), "reduced": max(s.reduced) * 8}
    assert formula == pytest.approx(simulated), (sizes, formula, simulated)
