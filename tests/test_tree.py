"""The binomial trees (naive all-reduce = reduce + broadcast, the binomial broadcast) and the
scatter + all-gather broadcast: checked against MPI, and their bytes sent per rank.

The test runs for N = 1..8, all in one launch of 8 ranks (a communicator of each size:
tests/helpers/subcomms.py), and loops over ops × dtypes × counts (the all-reduce sweeps
are tests/helpers/sweeps.py's); the broadcasts run from every root.
"""

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from helpers.sweeps import (
    LARGE,
    check_allreduce_matches_mpi_bit_for_bit,
    check_allreduce_random_floats_agree_across_ranks,
    counts_for,
    debug_check_off,
    traffic,
)

from mpidp.collectives import api

SIZES = range(1, 9)


def check_bcast_from_every_root(comm):
    n, rank = comm.Get_size(), comm.Get_rank()
    for algo in ("binomial", "scatter_allgather"):
        for dtype in (np.uint8, np.float64):
            large = dtype is np.float64 and n in LARGE
            for count in [*counts_for(n), 1 << 20] if large else counts_for(n):
                for root in range(n) if count < 1 << 20 else (n - 1,):
                    want = (np.arange(count) * (root + 1)).astype(dtype)
                    buf = want.copy() if rank == root else np.zeros(count, dtype)
                    api.bcast(comm, buf, root, algorithm=algo)
                    assert np.array_equal(buf, want), (algo, dtype, count, root)


def check_volume_matches_the_docstrings(comm):
    """Bytes sent per rank (G = the vector's bytes, b = one rank's block)."""
    n, rank = comm.Get_size(), comm.Get_rank()
    items = 840 * 2  # divisible by 2, by every n <= 8 and every q
    x = np.ones(items, np.float64)
    G = x.nbytes
    b = G // n

    # naive: a leaf sends G once in the reduce; rank 0 sends G to each of its L children
    L = (n - 1).bit_length()
    sent, rounds = traffic(comm, lambda c: api.iallreduce(c, x, np.empty_like(x),
                                                          algorithm="naive"))
    if rank == 0:
        assert sent == L * G

    # scatter + all-gather broadcast: the root sends G·(n-1)/n in the scatter, + a block
    sent, rounds = traffic(comm, lambda c: api.ibcast(c, x.copy(), 0,
                                                      algorithm="scatter_allgather"))
    if rank == 0 and n > 1:
        assert sent == G * (n - 1) // n + (n - 1) * b


def check_naive_and_the_broadcasts(comm):
    check_allreduce_matches_mpi_bit_for_bit(comm, ("naive",))
    check_allreduce_random_floats_agree_across_ranks(comm, ("naive",))
    check_bcast_from_every_root(comm)
    with debug_check_off():
        check_volume_matches_the_docstrings(comm)


@pytest.mark.mpi(ranks=[8], timeout=600)
def test_naive_allreduce_and_the_broadcasts_match_mpi(mpi_ranks):
    on_each_size(SIZES, check_naive_and_the_broadcasts)


def test_sim_binomial_bcast_takes_one_child_a_round_as_its_picture_and_cost_say():
    """A rank sends to one child per round, farthest first, so N ranks take ⌈log2 N⌉ steps
    (the cost's rounds), N = 3 too: its root sends to 2, then to 1, not both at once."""
    from mpidp.collectives.algorithms.tree import binomial_cost
    from mpidp.sim import simulate

    for N in range(1, 18):
        for root in {0, N - 1}:
            out = simulate("bcast", "binomial", N, 4 * N, root=root, trace=True)
            assert not out.problems(), (N, root)
            assert out.sim.steps == (N - 1).bit_length() == binomial_cost(N, 1.0).rounds, N
            per_step_and_sender = [(step, src) for step, src, *_ in out.sim.events]
            assert len(per_step_and_sender) == len(set(per_step_and_sender)) == N - 1, N
