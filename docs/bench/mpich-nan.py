"""What the MPI library's MAX and MIN do with NaN and signed zeros, beside mpidp's.

    mpiexec -n N python docs/bench/mpich-nan.py      (N = 1..8; docs/guarantees.md)

1. ``Op.Reduce_local(inbuf, inoutbuf)`` on one pair, both orders.
2. ``Allreduce`` of N items where item k is NaN on rank k only (the others hold
   rank + 1): which ranks' NaN survive, for 1 item per rank (small messages) and
   for the same pattern repeated to 2^20 items (large: another algorithm).
3. Whether every rank gets the same bytes: MAX of -0.0 (even ranks) and 0.0 (odd),
   and SUM of NaNs whose payload is the rank.
"""

import numpy as np
from mpi4py import MPI

import mpidp

comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()
nan = np.nan


def show(*args):
    if rank == 0:
        print(*args, flush=True)


def same_everywhere(y) -> bool:
    return len(set(comm.allgather(y.tobytes()))) == 1


show(MPI.Get_library_version().splitlines()[0].strip(), f"N = {n}")
if n == 1:
    for name, op in (("MAX", MPI.MAX), ("MIN", MPI.MIN)):
        for a, b in ((nan, 1.0), (1.0, nan), (-0.0, 0.0), (0.0, -0.0)):
            inout = np.array([b])
            op.Reduce_local(np.array([a]), inout)
            ours = np.array([b])
            mpidp.OPS[name.lower()](ours, np.array([a]))
            show(f"  {name}.Reduce_local(in={a}, inout={b}) -> {inout[0]}   mpidp: {ours[0]}")
for name, op in (("MAX", MPI.MAX), ("MIN", MPI.MIN)):
    for reps in (1, (1 << 20) // n):
        x = np.tile([nan if rank == k else float(rank + 1) for k in range(n)], reps)
        y, ours = np.empty_like(x), np.empty_like(x)
        comm.Allreduce(x, y, op=op)
        mpidp.allreduce(comm, x, ours, op=op)
        kept = [k for k in range(n) if np.isnan(y[k])]
        show(f"  {name} Allreduce, {x.size} items, NaN on rank k only at item k: the NaN of "
             f"ranks {kept} kept (mpidp: {[k for k in range(n) if np.isnan(ours[k])]}); "
             f"same bytes on every rank: {same_everywhere(y)} (mpidp: {same_everywhere(ours)})")
for count in (1, 1 << 20):
    z = np.full(count, -0.0 if rank % 2 == 0 else 0.0)
    y = np.empty_like(z)
    comm.Allreduce(z, y, op=MPI.MAX)
    p = np.full(count, nan)
    p.view(np.uint64)[...] |= np.uint64(rank + 1)
    s = np.empty_like(p)
    comm.Allreduce(p, s, op=MPI.SUM)
    show(f"  {count} items: MAX of -0.0/0.0 gives {y[0]}, same on every rank: "
         f"{same_everywhere(y)}; SUM of NaN payloads gives payload "
         f"{int(s.view(np.uint64)[0] & np.uint64(0xFFFFF))}, same on every rank: "
         f"{same_everywhere(s)}")
