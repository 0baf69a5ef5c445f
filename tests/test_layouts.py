"""Allgatherv with a layout of its own on every rank, as MPI allows.

In MPI_Allgatherv the counts are the same on every rank, but each rank describes
its own recvbuf: its own displacements, gaps between blocks, blocks in any order.
A rank's layout is its own business: what travels must depend on the counts
alone. Here every rank draws its layout from a different family (packed, gaps,
reversed, shuffled, touching but out of order, one gap only), the results are
compared with the MPI library's own Allgatherv on the same inputs and the same
per-rank layouts, through every entry point and every algorithm, for N = 2..8 in one
launch of 8 ranks (a communicator of each size: tests/helpers/subcomms.py); the
simulator runs the same for N up to 64.
"""

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives import cost
from mpidp.collectives.api import ALGORITHMS
from mpidp.sim import simulate

SENTINEL = -7.0  # what the gaps hold before and must hold after
KINDS = ("packed", "gaps", "reversed", "reversed_gaps", "shuffled", "one_gap")
ENTRY_POINTS = ("allgather", "allgather_in_place", "iallgather", "allgatherv_init",
                "Allgatherv", "Allgatherv_in_place", "Iallgatherv", "Allgatherv_init")


def layout(kind: str, counts: list[int], seed: int) -> list[int]:
    """Displacements of `counts` in one of the `KINDS` (a rank's own recvbuf layout)."""
    n = len(counts)
    rng = np.random.default_rng([seed, len(kind), n])
    order = list(range(n))
    gaps = [0] * n
    if kind in ("reversed", "reversed_gaps"):
        order.reverse()
    if kind == "shuffled":
        order = rng.permutation(n).tolist()
    if kind in ("gaps", "reversed_gaps"):
        gaps = rng.integers(1, 3, n).tolist()
    if kind == "one_gap":  # as packed, but the last block one item further on
        gaps[n - 1] = 1
    displs, at = [0] * n, 0
    for i, b in enumerate(order):
        at += gaps[i]
        displs[b] = at
        at += counts[b]
    return displs


def count_sets(n: int) -> list[list[int]]:
    """Counts: all zero, all one, some zero, uneven, and one large enough for the ring."""
    return [[0] * n, [1] * n, [2] * n, [(r * 3) % 4 for r in range(n)],
            [r % 2 for r in range(n)], [5 + r for r in range(n)], [3000 + r for r in range(n)]]


def run_mpidp(comm, entry: str, algorithm: str, mine, recv, counts, displs) -> None:
    """One all-gather of `mine` into `recv` (this rank's `displs`) through `entry`."""
    rank = comm.Get_rank()
    in_place = entry.endswith("in_place")
    if in_place:
        recv[displs[rank] : displs[rank] + counts[rank]] = mine
    send = mpidp.IN_PLACE if in_place else mine
    spec = [recv, (counts, displs), MPI.DOUBLE]
    if entry.startswith("allgather"):
        mpidp.allgather(comm, send, recv, counts, displs, algorithm=algorithm)
    elif entry == "iallgather":
        mpidp.iallgather(comm, send, recv, counts, displs, algorithm=algorithm).wait()
    elif entry.startswith("Allgatherv") and entry != "Allgatherv_init":
        mpidp.Comm(comm).Allgatherv(send, spec, algorithm=algorithm)
    elif entry == "Iallgatherv":
        mpidp.Comm(comm).Iallgatherv(send, spec, algorithm=algorithm).Wait()
    else:  # persistent: started three times, the later starts replayed where replayable
        if entry == "allgatherv_init":
            req = mpidp.allgatherv_init(comm, send, recv, counts, displs, algorithm=algorithm)
        else:
            req = mpidp.Comm(comm).Allgatherv_init(send, spec, algorithm=algorithm)
        for _ in range(3):
            recv[...] = SENTINEL
            req.Start()
            req.Wait()
        req.Free()


def per_rank_layouts_against_mpi(comm) -> list[str]:
    """Every count set, entry point and algorithm on `comm`: what went wrong, on any rank
    (every rank reports: a wrong rank's neighbours may have been right)."""
    n, rank = comm.Get_size(), comm.Get_rank()
    cost.set_model(comm, *cost.DEFAULT)  # auto without calibrating (seconds under load)
    failures, case = [], 0
    for c, counts in enumerate(count_sets(n)):
        for shift in (0, 2, 4):  # every rank a different family, rotating
            kind = KINDS[(rank + shift) % len(KINDS)]
            displs = layout(kind, counts, seed=c * 100 + shift)
            mine = rank * 10000.0 + np.arange(counts[rank], dtype=np.float64)
            size = max(d + k for d, k in zip(displs, counts, strict=True)) + 2
            want = np.full(size, SENTINEL)
            comm.Allgatherv(mine, [want, (counts, displs), MPI.DOUBLE])
            entry = ENTRY_POINTS[case % len(ENTRY_POINTS)]  # each meets every count set
            case += 1
            for algorithm in ALGORITHMS["allgather"]:  # with auto
                got = np.full(size, SENTINEL)
                run_mpidp(comm, entry, algorithm, mine, got, counts, displs)
                if not np.array_equal(got, want):
                    failures.append(f"counts {counts} ({kind} here) {algorithm} {entry}")
    everyone = comm.allgather(failures)
    return [f"N={n} rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs[:3]]


@pytest.mark.mpi(ranks=[8], timeout=450)
def test_allgatherv_per_rank_layouts_match_mpi(mpi_ranks):
    def check(comm):
        bad = per_rank_layouts_against_mpi(comm)
        assert not bad, "\n".join(bad)

    on_each_size(range(2, 9), check)


@pytest.mark.parametrize("algorithm", ALGORITHMS["allgather"][:-1])
def test_simulated_per_rank_layouts(algorithm):
    """N = 2..64: every rank its own layout, results checked rank by rank (NumPy reference)."""
    for n in [*range(2, 17), 24, 31, 32, 33, 48, 63, 64]:
        for c, counts in enumerate([[(r * 3) % 4 for r in range(n)], [1] * n, [0] * n]):
            displs = [layout(KINDS[(r + c) % len(KINDS)], counts, seed=c) for r in range(n)]
            out = simulate("allgather", algorithm, n, counts=counts, displs=displs)
            assert not out.problems(), (n, counts, out.problems())
