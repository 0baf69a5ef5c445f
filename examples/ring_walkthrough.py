"""Watch a ring all-reduce step by step, then check it against MPI's own Allreduce.

    mpiexec -n 4 python examples/ring_walkthrough.py

Every rank holds the vector [r, r, ..., r] cut into N blocks. The schedule is a
generator of rounds (lists of Send/Recv); this script drives it by hand, one
round at a time, and rank 0 prints who sends which block to whom in each step.
"""

import sys

import numpy as np
from mpi4py import MPI

from mpidp import watchdog
from mpidp.collectives import SUM
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.ring import ring_allreduce
from mpidp.collectives.algorithms.rounds import Send
from mpidp.collectives.engine.driver import exchange


def block_of(view, buf, blocks) -> str:
    """Which block of `buf` a message view is ('tmp' for the scratch buffer)."""
    if not np.shares_memory(view, buf):
        return "tmp"
    offset = (view.__array_interface__["data"][0] - buf.__array_interface__["data"][0])
    return str(blocks.displs.index(offset // buf.itemsize))


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    count = 2 * n
    buf = np.full(count, float(rank + 1))  # rank r contributes r + 1 everywhere
    blocks = Blocks.even(count, n)
    tmp = np.empty(blocks.max)
    if rank == 0:
        print(f"ring all-reduce of {count} floats on {n} ranks, blocks {blocks.counts}")
        print("phase 1 (steps 0..N-2): reduce-scatter; phase 2: all-gather\n")
    for step, round_ in enumerate(ring_allreduce(comm, buf, blocks, SUM, tmp)):
        send = next(m for m in round_ if type(m) is Send)
        recv = next(m for m in round_ if type(m) is not Send)
        into = block_of(recv.buf, buf, blocks)
        if into == "tmp":  # reduce-scatter: the partial sum is added to block rank-step-2
            into = f"tmp, then adds it into block {(rank - step - 2) % n}"
        else:
            into = f"block {into}"
        line = (f"rank {rank}: sends block {block_of(send.buf, buf, blocks)} to rank "
                f"{send.peer}; receives from rank {recv.peer} into {into}")
        exchange(comm, round_, tag=1)
        lines = comm.gather(line, root=0)
        if rank == 0:
            phase = "reduce-scatter" if step < n - 1 else "all-gather"
            print(f"step {step} ({phase}):")
            print("\n".join("  " + s for s in lines))
    want = np.empty(count)
    comm.Allreduce(np.full(count, float(rank + 1)), want)
    ok = comm.allreduce(bool(np.array_equal(buf, want)), op=MPI.LAND)
    if rank == 0:
        print(f"\nresult on rank 0: {buf}")
        print(f"MPI.Allreduce:    {want}")
        print("every rank matches MPI's Allreduce" if ok else "MISMATCH with MPI's Allreduce")
    if not ok:
        comm.Abort(1)


if __name__ == "__main__":
    sys.exit(watchdog.run(main, "ring_walkthrough.py"))  # an exception on one rank ends the job
