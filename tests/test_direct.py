"""The direct all-reduce (every rank sends its whole vector to every other, in one round):
checked against MPI, and its bytes.

Runs for N = 1..8 and loops over ops × dtypes × counts inside one launch (the sweeps are
tests/helpers/sweeps.py's).
"""

import numpy as np
import pytest
from helpers.sweeps import (
    check_allreduce_matches_mpi_bit_for_bit,
    check_allreduce_random_floats_agree_across_ranks,
    debug_check_off,
)
from mpi4py import MPI

from mpidp.collectives import CountingComm, api

RANKS = [1, 2, 3, 4, 5, 6, 7, 8]


def check_volume_matches_the_docstring(comm):
    """G(N-1) sent and G(N-1) received, in one round."""
    n = comm.Get_size()
    items = 840 * 2  # divisible by 2, by every n <= 8 and every q
    x = np.ones(items, np.float64)
    G = x.nbytes

    # direct: the whole vector to and from every other rank, in one round
    counter = CountingComm(comm)
    handle = api.iallreduce(counter, x, np.empty_like(x), algorithm="direct")
    handle.wait()
    assert counter.bytes_sent == counter.bytes_received == G * (n - 1)
    assert handle.rounds == (1 if n > 1 else 0)


@pytest.mark.mpi(ranks=RANKS, timeout=300)
def test_direct_allreduce_matches_mpi(mpi_ranks):
    check_allreduce_matches_mpi_bit_for_bit(MPI.COMM_WORLD, ("direct",))
    check_allreduce_random_floats_agree_across_ranks(MPI.COMM_WORLD, ("direct",))
    with debug_check_off():
        check_volume_matches_the_docstring(MPI.COMM_WORLD)
