"""GPU check: mpidp on CuPy arrays, against MPI's own results. Run by `make gpu-check`.

    mpiexec -n N python examples/gpu_check.py   (N = 1..4; ranks may share one GPU)

1. Every collective and algorithm on CuPy buffers (staged through host memory,
   or handed to MPI directly where it is CUDA-aware) equals MPI's Allreduce /
   Reduce_scatter / Allgather / Bcast on host copies of the same inputs.
2. Data-parallel training on the GPU: N ranks on shards equal one rank on the
   global batch (float64), and every rank holds bitwise-identical parameters.
3. A small bandwidth table: all-reduce of CuPy buffers, staged, and CUDA-aware
   where the MPI library is, against native Allreduce of host buffers.
Exits non-zero on any mismatch.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import mpidp
from mpidp import watchdog
from mpidp.collectives.engine import staging as buffers


def say(comm, *args):
    if comm.rank == 0:
        print(*args, flush=True)


def check_collectives(comm, cp) -> int:
    n, rank = comm.size, comm.rank
    bad = 0
    for count in (0, 1, n + 1, 1000, 1 << 20):
        x = cp.arange(count, dtype=cp.float64) % 97 * (rank + 1)
        hx = cp.asnumpy(x)
        want = np.empty_like(hx)
        comm.Allreduce(hx, want)
        for algorithm in mpidp.ALGORITHMS["allreduce"]:
            y = cp.empty_like(x)
            mpidp.allreduce(comm, x, y, algorithm=algorithm)
            bad += not np.array_equal(cp.asnumpy(y), want)
            z = x.copy()
            mpidp.iallreduce(comm, mpidp.IN_PLACE, z, op="avg", algorithm=algorithm).wait()
            bad += not np.allclose(cp.asnumpy(z), want / n)
        rs_want = np.empty(count)
        comm.Reduce_scatter_block(np.tile(hx, n) if count else hx, rs_want)
        for algorithm in mpidp.ALGORITHMS["reduce_scatter"]:
            y = cp.empty(count, dtype=cp.float64)
            mpidp.reduce_scatter(comm, cp.tile(x, n), y, algorithm=algorithm)
            bad += not np.array_equal(cp.asnumpy(y), rs_want)
        ag_want = np.empty(count * n)
        comm.Allgather(hx, ag_want)
        for algorithm in mpidp.ALGORITHMS["allgather"]:
            y = cp.empty(count * n, dtype=cp.float64)
            mpidp.allgather(comm, x, y, algorithm=algorithm)
            bad += not np.array_equal(cp.asnumpy(y), ag_want)
        for algorithm in mpidp.ALGORITHMS["bcast"]:
            b = x.copy() if rank == n - 1 else cp.zeros_like(x)
            mpidp.bcast(comm, b, root=n - 1, algorithm=algorithm)
            bad += not np.array_equal(cp.asnumpy(b), cp.asnumpy(x) / (rank + 1) * n)
    return comm.allreduce(bad)


def check_training(comm, cp) -> int:
    from mpidp.training import MLP, SGD, DataParallel, ShardSampler, softmax_cross_entropy

    sizes, n_samples, batch = [20, 32, 16, 5], 96, 24
    rng = np.random.default_rng(1)
    x = cp.asarray(rng.standard_normal((n_samples, sizes[0])))
    y = cp.asarray(rng.integers(0, sizes[-1], n_samples))

    def run(ranks, rank, dp_comm):
        model = MLP(sizes, dtype="float64", seed=0, device="gpu")
        opt = SGD(model.params, model.grads, lr=0.1, momentum=0.9)
        sampler = ShardSampler(n_samples, batch, rank, ranks, seed=3)
        ddp = DataParallel(model, dp_comm) if dp_comm is not None else None
        for epoch in range(2):
            for (idx,) in sampler.epoch(epoch):
                step = ddp or model
                _, dlogits = softmax_cross_entropy(step.forward(x[idx]), y[idx])
                step.backward(dlogits)
                opt.step()
        if ddp is not None:
            ddp.close()
        return {k: cp.asnumpy(v) for k, v in model.params.items()}

    reference = run(1, 0, None)
    got = run(comm.size, comm.rank, comm)
    bad = sum(not np.allclose(got[k], reference[k], rtol=1e-10, atol=1e-12) for k in got)
    first = {k: v.copy() for k, v in got.items()}
    for k in first:
        comm.Bcast(first[k], root=0)
    bad += sum(not np.array_equal(got[k], first[k]) for k in got)
    return comm.allreduce(bad)


def bandwidth_table(comm, cp) -> None:
    n = comm.size
    modes = [("staged", "1")]
    if buffers.cuda_aware():
        modes.append(("cuda-aware", "0"))
    say(comm, f"\n{'bytes':>10} {'native(host) us':>16} " +
        " ".join(f"{m + ' us':>14} {'busbw GB/s':>11}" for m, _ in modes))
    for nbytes in (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26):
        count = nbytes // 8
        hx, hy = np.ones(count), np.empty(count)
        x, y = cp.ones(count), cp.empty(count)
        row = [f"{nbytes:>10}", f"{timed(comm, lambda a=hx, b=hy: comm.Allreduce(a, b)):>16.1f}"]
        for _, staging in modes:
            buffers.set_staging(staging if staging == "1" else "")
            t = timed(comm, lambda a=x, b=y: mpidp.allreduce(comm, a, b, algorithm="ring"))
            busbw = nbytes * 2 * (n - 1) / n / (t * 1e-6) / 1e9 if n > 1 else 0.0
            row += [f"{t:>14.1f}", f"{busbw:>11.2f}"]
        buffers.set_staging("")
        say(comm, " ".join(row))


def timed(comm, call, reps: int = 10) -> float:
    call()
    times = []
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        call()
        times.append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return float(np.median(times)) * 1e6


def main() -> int:
    comm = MPI.COMM_WORLD
    try:
        import cupy as cp

        ndev = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy, or no driver/device
        say(comm, f"SKIP: no usable CuPy/CUDA device ({exc})")
        return 0
    cp.cuda.Device(comm.rank % ndev).use()
    say(comm, f"== gpu-check on {comm.size} rank(s), {ndev} device(s), "
        f"CUDA-aware MPI: {buffers.cuda_aware()}, library {MPI.Get_library_version().split()[:3]}")
    bad = check_collectives(comm, cp)
    say(comm, f"collectives on CuPy buffers vs MPI: {'OK' if not bad else f'{bad} MISMATCHES'}")
    bad_train = check_training(comm, cp)
    say(comm, f"GPU training, {comm.size} ranks vs 1 rank on the global batch: "
        f"{'OK' if not bad_train else f'{bad_train} MISMATCHES'}")
    bandwidth_table(comm, cp)
    return 1 if bad or bad_train else 0


if __name__ == "__main__":
    sys.exit(watchdog.run(main, "gpu_check.py"))  # an exception on one rank ends the job
