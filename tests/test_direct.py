"""The direct all-reduce (every rank sends its whole vector to every other, in one round):
checked against MPI, and its bytes.

Runs for N = 1..8, all in one launch of 8 ranks (a communicator of each size:
tests/helpers/subcomms.py), and loops over ops × dtypes × counts (the sweeps are
tests/helpers/sweeps.py's).
"""

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from helpers.sweeps import (
    check_allreduce_matches_mpi_bit_for_bit,
    check_allreduce_random_floats_agree_across_ranks,
    debug_check_off,
)

from mpidp.collectives import CountingComm, api

SIZES = range(1, 9)


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


def check_direct(comm):
    check_allreduce_matches_mpi_bit_for_bit(comm, ("direct",))
    check_allreduce_random_floats_agree_across_ranks(comm, ("direct",))
    with debug_check_off():
        check_volume_matches_the_docstring(comm)


@pytest.mark.mpi(ranks=[8], timeout=600)
def test_direct_allreduce_matches_mpi(mpi_ranks):
    on_each_size(SIZES, check_direct)
