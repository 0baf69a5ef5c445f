"""Uneven inputs: ``with ddp.join():`` equals one rank on the samples the training ranks saw.

Rank r runs ``counts[r]`` steps of A micro-batches of B samples each, no two ranks the
same samples. Step s's reference is one rank on the union of what the ranks still
training saw in step s (T·A·B samples): in float64 its mean gradient (to rounding), in
deterministic mode `DataParallel` on `MPI.COMM_SELF` over those T·A micro-shards
(bitwise). A job whose ranks hold fewer batches must end, not hang (the timeout).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from mpidp.training import MLP, SGD, DataParallel, softmax_cross_entropy

SIZES = [6, 8, 7, 3]  # 3 layers: 3 buckets with bucket_mb=0
B = 2  # samples per micro-batch
HYPER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
TOL = {"rtol": 1e-11, "atol": 1e-13}  # float64, summation order only
CASES = {  # steps per rank on n ranks: shards differing by 0, 1 and many batches
    "even": lambda n: [2] * n,
    "one fewer": lambda n: [3] * (n - 1) + [2],
    "many": lambda n: [4, 0, 1, 3, 2][:n],
}
# (ZeRO stage, deterministic, overlap, A micro-batches a step, bucket_mb)
MODES = [(0, False, True, 1, 0.0), (0, False, False, 2, 25.0), (1, False, True, 2, 0.0),
         (2, False, False, 1, 0.0), (3, False, True, 2, 0.0), (0, True, True, 2, 0.0),
         (1, True, False, 1, 25.0), (2, True, True, 2, 0.0), (3, True, False, 2, 0.0)]


def schedule(counts: list[int], A: int) -> tuple[list, list]:
    """(rank -> its steps, each (A, B) sample indices; step -> the union of the indices
    of the ranks training in it), samples numbered in order, none twice."""
    mine, union, cursor = [[] for _ in counts], [], 0
    for s in range(max(counts)):
        seen = []
        for r, c in enumerate(counts):
            if s < c:
                idx = np.arange(cursor, cursor + A * B).reshape(A, B)
                mine[r].append(idx)
                seen.append(idx)
                cursor += A * B
        union.append(np.concatenate(seen))  # (T, A, B)
    return mine, union


def dataset(dtype: str, n: int = 200):
    rng = np.random.default_rng(3)
    return rng.standard_normal((n, SIZES[0])).astype(dtype), rng.integers(0, SIZES[-1], n)


def copied(params) -> dict:
    return {k: v.copy() for k, v in params.items()}


def reference(counts: list[int], A: int, deterministic: bool) -> dict:
    """One rank on each step's union: float64 one batch, or the exact average of its
    T·A micro-shards (float32) on COMM_SELF."""
    dtype = "float32" if deterministic else "float64"
    x, y = dataset(dtype)
    _, union = schedule(counts, A)
    model = MLP(SIZES, dtype=dtype, seed=0)
    opt = SGD(model.params, model.grads, **HYPER)
    if not deterministic:
        for idx in union:
            idx = idx.reshape(-1)
            _, dlogits = softmax_cross_entropy(model.forward(x[idx]), y[idx])
            model.backward(dlogits)
            opt.step()
        return copied(model.params)
    with DataParallel(model, MPI.COMM_SELF, optimizer=opt, deterministic=True) as ddp:
        for idx in union:
            shards = idx.reshape(-1, B)
            for k, shard in enumerate(shards):
                with ddp.no_sync() if k < len(shards) - 1 else nullcontext():
                    _, dlogits = softmax_cross_entropy(ddp.forward(x[shard]), y[shard])
                    ddp.backward(dlogits)
            ddp.step()
        return copied(model.params)


def train(comm, counts: list[int], mode: tuple, join: bool = True) -> dict:
    """Rank r's own loop over its counts[r] steps, inside ``join()``; the parameters after."""
    zero, deterministic, overlap, A, bucket_mb = mode
    dtype = "float32" if deterministic else "float64"
    rank = comm.Get_rank()
    x, y = dataset(dtype)
    mine, _ = schedule(counts, A)
    model = MLP(SIZES, dtype=dtype, seed=rank)  # other weights on every rank: broadcast
    opt = SGD(model.params, model.grads, **HYPER)
    with DataParallel(model, comm, bucket_mb=bucket_mb, overlap=overlap, algorithm="ring",
                      optimizer=opt, zero=zero, deterministic=deterministic) as ddp:
        with ddp.join() if join else nullcontext():
            for step in mine[rank]:  # (A, B)
                for a, idx in enumerate(step):
                    with ddp.no_sync() if a < A - 1 else nullcontext():
                        _, dlogits = softmax_cross_entropy(ddp.forward(x[idx]), y[idx])
                        ddp.backward(dlogits if deterministic else dlogits / A)
                ddp.step()
        ddp.check_replicas()  # the joined ranks stepped too: every replica the same
        with ddp.gathered() as params:
            return copied(params)


def compare(got: dict, want: dict, bitwise: bool, what: str) -> None:
    for name in want:
        if bitwise:
            assert got[name].dtype == want[name].dtype
            if not np.array_equal(got[name], want[name]):
                worst = np.max(np.abs(got[name].astype(np.float64) - want[name]))
                pytest.fail(f"{what}: {name} differs from one rank (max |diff| {worst:.3g})")
        else:
            np.testing.assert_allclose(got[name], want[name], **TOL, err_msg=f"{what} {name}")


@pytest.mark.mpi(ranks=[5], timeout=300)
def test_uneven_shards_equal_one_rank_on_the_samples_seen(mpi_ranks):
    """N = 2..5 in one launch; each mode meets each case on some N (case = (mode + N) % 3);
    an even case inside join() is bitwise the run without it."""
    names = list(CASES)

    def check(comm):
        n = comm.Get_size()
        for m, mode in enumerate(MODES):
            case = names[(m + n) % 3]
            counts = CASES[case](n)
            what = f"N={n} {case} {counts} mode {mode}"
            got = train(comm, counts, mode)
            compare(got, reference(counts, mode[3], mode[1]), mode[1], what)
            if case == "even":
                compare(got, train(comm, counts, mode, join=False), True, f"{what} no join")

    with threadpool_limits(1, user_api="blas"):
        on_each_size((2, 3, 4, 5), check)


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_broken_promises_raise_on_every_rank_not_hang(mpi_ranks):
    """Ranks that disagree on no_sync(), or one leaving with micro-batches not reduced."""
    x, y = dataset("float64")

    def run(comm, micro: list[int], steps: list[int]):
        rank = comm.Get_rank()
        model = MLP(SIZES, dtype="float64", seed=0)
        opt = SGD(model.params, model.grads, **HYPER)
        with DataParallel(model, comm, optimizer=opt, algorithm="ring") as ddp:
            with ddp.join():
                for _ in range(steps[rank]):
                    for a in range(micro[rank]):
                        with ddp.no_sync() if a < micro[rank] - 1 else nullcontext():
                            _, dlogits = softmax_cross_entropy(ddp.forward(x[:B]), y[:B])
                            ddp.backward(dlogits)
                    ddp.step()
                if rank == 1:  # half a step more: a no_sync() backward, then out
                    with ddp.no_sync():
                        _, dlogits = softmax_cross_entropy(ddp.forward(x[:B]), y[:B])
                        ddp.backward(dlogits)

    def check(comm):
        with pytest.raises(RuntimeError, match="same micro-batches per step"):
            run(comm, micro=[2, 1, 2], steps=[1, 1, 1])
        with pytest.raises(RuntimeError, match="left the loop with no_sync"):
            run(comm, micro=[2, 2, 2], steps=[2, 1, 1])

    on_each_size((3,), check)


def test_join_needs_a_step_the_forward_inside_no_sync_and_no_nesting():
    model = MLP(SIZES, dtype="float64", seed=0)
    x, y = dataset("float64")
    with DataParallel(model, MPI.COMM_SELF) as ddp:
        with pytest.raises(ValueError, match="pass optimizer="):
            ddp.join()
        opt = SGD(model.params, model.grads, **HYPER)
        with ddp.join(step=opt.step) as j:
            with pytest.raises(RuntimeError, match="already inside a join"):
                with ddp.join(step=opt.step):
                    pass
            logits = ddp.forward(x[:B])  # agreed: this backward syncs ...
            with ddp.no_sync(), pytest.raises(RuntimeError, match="must hold the forward"):
                ddp.backward(softmax_cross_entropy(logits, y[:B])[1])  # ... it did not
            assert j.reducer is ddp.reducer
        assert ddp.reducer is j.reducer.inner  # join() leaves the reducer it found
