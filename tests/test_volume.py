"""The article's volume claim, asserted with a byte-counting communicator.

All-reduce = reduce-scatter + all-gather: with G bytes on each of N ranks, each
rank sends G(N-1)/N in each half, D = 2·G·(N-1)/N in all, in 2(N-1) rounds.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpidp
from mpidp.collectives.algorithms.blocks import Blocks


@pytest.mark.mpi(ranks=[1, 2, 3, 4, 5, 6, 7, 8], timeout=60)
def test_ring_sends_2G_N_minus_1_over_N(mpi_ranks, no_debug_check):
    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.CountingComm(world)
    for count in (840, 1000, 7, 0):  # 840 is divisible by 1..8; the others mostly not
        x = np.ones(count, dtype=np.float32)
        G = x.nbytes
        blocks = Blocks.even(count, n)
        mine, right = blocks.counts[rank], blocks.counts[(rank + 1) % n]
        item = x.itemsize

        comm.reset()
        h = mpidp.iallreduce(comm, x, np.empty_like(x), algorithm="ring")
        h.wait()
        # reduce-scatter sends every block but mine; all-gather every block but my right's
        exact = (2 * count - mine - right) * item
        assert comm.bytes_sent == exact
        if count and count % n == 0:
            assert comm.bytes_sent == 2 * G * (n - 1) / n
        assert h.rounds == (2 * (n - 1) if count else 0)
        assert comm.messages_sent == h.rounds
        assert comm.peers <= {(rank + 1) % n}  # a ring: only ever to the right

        comm.reset()
        h = mpidp.ireduce_scatter(comm, np.ones(count * n, np.float32),
                                  np.empty(count, np.float32), algorithm="ring")
        h.wait()
        assert comm.bytes_sent == count * item * (n - 1) == count * n * item * (n - 1) / n
        assert h.rounds == n - 1

        comm.reset()
        h = mpidp.iallgather(comm, x, np.empty(count * n, np.float32), algorithm="ring")
        h.wait()
        assert comm.bytes_sent == count * item * (n - 1)
        assert h.rounds == n - 1
