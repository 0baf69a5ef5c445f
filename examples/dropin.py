"""An mpi4py program switched to mpidp's collectives by changing one line.

    mpiexec -n 4 python examples/dropin.py [algorithm]

`program` below is ordinary mpi4py code: it knows nothing about mpidp. It runs
twice, once on the MPI library's communicator and once on

    comm = mpidp.Comm(MPI.COMM_WORLD)     # the one changed line

whose Allreduce, Allgather, Bcast, ... are mpidp's point-to-point algorithms.
Rank 0 prints both results and whether they agree. `algorithm` (optional) is a
name from mpidp.ALGORITHMS, such as ring or recursive_doubling.
"""

import sys

import numpy as np
from mpi4py import MPI

import mpidp
from mpidp import watchdog


def program(comm) -> dict:
    """A few steps of a typical data-parallel job, in plain mpi4py."""
    rank, size = comm.Get_rank(), comm.Get_size()
    results = {}

    # the root broadcasts the hyperparameters
    config = np.array([0.1, 0.9, 32.0]) if rank == 0 else np.empty(3)
    comm.Bcast(config, root=0)
    results["Bcast config"] = config

    # sum the gradients of all ranks, then average
    grad = np.arange(6, dtype=np.float32) * (rank + 1)
    total = np.empty_like(grad)
    comm.Allreduce(grad, total, op=MPI.SUM)
    results["Allreduce grad / size"] = total / size

    # every rank learns every rank's loss
    losses = np.empty(size)
    comm.Allgather(np.array([1.0 / (rank + 1)]), losses)
    results["Allgather losses"] = losses

    # the largest step count, in place, with an explicit datatype
    steps = np.array([100 + 10 * rank], dtype="i")
    comm.Allreduce(MPI.IN_PLACE, [steps, MPI.INT], op=MPI.MAX)
    results["Allreduce MAX steps"] = steps

    # each rank owns a shard of the summed vector: started now, waited for later
    shard = np.empty(2, dtype=np.int64)
    request = comm.Ireduce_scatter_block(np.arange(2 * size, dtype=np.int64) * rank, shard)
    request.Wait()
    results["Ireduce_scatter_block shard"] = shard
    return results


def main() -> int:
    algorithm = sys.argv[1] if len(sys.argv) > 1 else "auto"
    world = MPI.COMM_WORLD

    comm = MPI.COMM_WORLD
    native = program(comm)

    comm = mpidp.Comm(MPI.COMM_WORLD, algorithm=algorithm)  # <- the one changed line
    ours = program(comm)

    agree = all(np.array_equal(native[key], ours[key]) for key in native)
    everywhere = world.allreduce(agree, op=MPI.LAND)  # did every rank get the same results?
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, mpidp algorithm={algorithm!r}  (results on rank 0)")
        for key in native:
            same = "agree" if np.array_equal(native[key], ours[key]) else "DIFFER"
            print(f"{key:30s} native {native[key]}\n{'':30s} mpidp  {ours[key]}   {same}")
        print("all results agree on every rank" if everywhere else "results DIFFER")
    return 0 if everywhere else 1


if __name__ == "__main__":
    sys.exit(watchdog.run(main, "dropin.py"))  # an exception on one rank ends the job
