"""Uneven inputs: ``with ddp.join():`` equals one rank on the samples the training ranks saw.

Rank r runs ``counts[r]`` steps of A micro-batches of B samples each, no two ranks the
same samples. Step s's reference is one rank on the union of what the ranks still
training saw in step s (T·A·B samples): in float64 its mean gradient (to rounding), in
deterministic mode `DataParallel` on `MPI.COMM_SELF` over those T·A micro-shards
(bitwise). A job whose ranks hold fewer batches must end, not hang (the timeout).
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI
from test_determinism import gpt_trainer, refused_before_training, run_trainer
from threadpoolctl import threadpool_limits

from mpidp import watchdog
from mpidp.training import MLP, SGD, DataParallel, clip_grad_norm, softmax_cross_entropy
from mpidp.training.checkpoint import read
from mpidp.training.data import UnevenSampler

SIZES = [6, 8, 7, 3]  # 3 layers: 3 buckets with bucket_mb=0
B = 2  # samples per micro-batch
HYPER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
TOL = {"rtol": 1e-11, "atol": 1e-13}  # float64, summation order only
CLIP = 0.3  # runs with an odd mode clip to it in step= (the joined ranks too): it acts
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


def reference(counts: list[int], A: int, deterministic: bool, clip: bool = False) -> dict:
    """One rank on each step's union: float64 one batch, or the exact average of its
    T·A micro-shards (float32) on COMM_SELF; maybe clipped to CLIP."""
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
            if clip:
                norm = np.sqrt(sum(float(np.vdot(g, g)) for g in model.grads.values()))
                for g in model.grads.values():
                    g *= min(1.0, CLIP / (norm + 1e-6))
            opt.step()
        return copied(model.params)
    with DataParallel(model, MPI.COMM_SELF, optimizer=opt, deterministic=True) as ddp:
        for idx in union:
            shards = idx.reshape(-1, B)
            for k, shard in enumerate(shards):
                with ddp.no_sync() if k < len(shards) - 1 else nullcontext():
                    _, dlogits = softmax_cross_entropy(ddp.forward(x[shard]), y[shard])
                    ddp.backward(dlogits)
            if clip:
                clip_grad_norm(ddp, CLIP)
            ddp.step()
        return copied(model.params)


def train(comm, counts: list[int], mode: tuple, join: bool = True, clip: bool = False) -> dict:
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
        def step():  # on every rank after each synced backward: joined ones too
            if clip:
                clip_grad_norm(ddp, CLIP)
            ddp.step()

        with ddp.join(step) if join else nullcontext():
            for micro in mine[rank]:  # (A, B)
                for a, idx in enumerate(micro):
                    with ddp.no_sync() if a < A - 1 else nullcontext():
                        _, dlogits = softmax_cross_entropy(ddp.forward(x[idx]), y[idx])
                        ddp.backward(dlogits if deterministic else dlogits / A)
                step()
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
    """N = 2..5 in one launch: every (mode, case) once, on N = 2 + (mode + 2·case) % 4, so
    that every N meets every case; an even case inside join() is bitwise the run without
    it (every third mode); odd modes clip the gradient in join's step=."""
    runs = [(m, c, 2 + (m + 2 * c) % 4) for m in range(len(MODES)) for c in range(len(CASES))]

    def check(comm):
        n = comm.Get_size()
        for m, c, _ in [r for r in runs if r[2] == n]:
            mode, case = MODES[m], list(CASES)[c]
            counts = CASES[case](n)
            what = f"N={n} {case} {counts} mode {mode}"
            clip = m % 2 == 1
            got = train(comm, counts, mode, clip=clip)
            compare(got, reference(counts, mode[3], mode[1], clip), mode[1], f"{what} {clip=}")
            if case == "even" and m % 3 == 0:
                compare(got, train(comm, counts, mode, False, clip), True, f"{what} no join")

    assert {(c, n) for _, c, n in runs} == {(c, n) for c in range(3) for n in (2, 3, 4, 5)}

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
    model = MLP(SIZES, dtype="float32", seed=0)
    with DataParallel(model, MPI.COMM_SELF, comm_hook="bf16") as ddp:
        with pytest.raises(ValueError, match="communication hook"):
            ddp.join(step=lambda: None)


# ------------------------------------------------------------------ the trainers' --uneven


def mlp_reference(argv: dict, n: int) -> dict:
    """train_mlp.py --uneven's step on one process: each step the mean over the ranks in it
    of their micro-batches' mean gradients (1/A each), clipped, then SGD."""
    from mpidp.training import data as datasets

    ds = datasets.digits(seed=0)
    x, y = ds.x_train.astype("float64"), ds.y_train
    A, G = argv["--accum-steps"], argv["--global-batch"]
    model = MLP([ds.features, 16, ds.classes], dtype="float64", seed=0)
    opt = SGD(model.params, model.grads, 0.05, 0.9, 1e-4)
    ranks = [UnevenSampler(len(y), G, r, n, 0, A).epoch(0) for r in range(n)]
    total = {k: np.zeros_like(v) for k, v in model.grads.items()}
    for s in range(max(map(len, ranks))):
        ins = [steps[s] for steps in ranks if s < len(steps)]
        for t in total.values():
            t[...] = 0
        for micro in ins:
            for idx in micro:
                _, dlogits = softmax_cross_entropy(model.forward(x[idx]), y[idx])
                model.backward(dlogits / A)
                for k, g in model.grads.items():
                    total[k] += g / len(ins)
        norm = np.sqrt(sum(float(np.vdot(t, t)) for t in total.values()))
        for k, g in model.grads.items():
            g[...] = total[k] * min(1.0, argv["--clip-grad"] / (norm + 1e-6))
        opt.step()
    return {f"param/{k}": v for k, v in model.params.items()}


@pytest.mark.mpi(ranks=[3], timeout=300)
def test_the_trainers_run_uneven_shards_to_the_end(mpi_ranks, shared_dir):
    """train_mlp.py --uneven --clip-grad on 3 ranks (shards of 1/6, 2/6, 3/6: 29, 59 and 90
    steps) equals its one-process reference; train_gpt.py --uneven, with ZeRO-3 and a
    checkpoint every 7 steps (collectives in the step), ends."""
    comm = MPI.COMM_WORLD
    argv = {"--accum-steps": 2, "--global-batch": 24, "--clip-grad": 0.5}
    path = f"{shared_dir}/mlp.npz"
    run_trainer(comm, ["--uneven", "--dtype", "float64", "--hidden", "16", "--epochs", "1",
                       "--progress", "never", "--checkpoint", path,
                       *[str(v) for kv in argv.items() for v in kv]])
    comm.Barrier()
    state = read(path)
    want = mlp_reference(argv, comm.Get_size())
    for name, value in want.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
    gpt = gpt_trainer()
    metrics = f"{shared_dir}/gpt.jsonl"
    args = gpt.parse_args(["--uneven", "--corpus-mb", "0.02", "--context", "16", "--layers",
                           "1", "--width", "16", "--heads", "2", "--global-batch", "48",
                           "--epochs", "1", "--eval-every", "1000", "--sample-tokens", "0",
                           "--zero", "3", "--optimizer", "adam", "--clip-grad", "1",
                           "--checkpoint", f"{shared_dir}/gpt.npz", "--checkpoint-every",
                           "7", "--metrics", metrics, "--progress", "never"])
    with watchdog.guard("auto", "training") as dog, threadpool_limits(1, user_api="blas"):
        assert gpt.train(args, comm, dog) == 0
    if comm.Get_rank() == 0:
        rows = [json.loads(line) for line in open(metrics)]
        assert rows[-1]["step"] > rows[0]["step"]


@pytest.mark.parametrize("argv, words", [
    (["--clip-grad", "0"], "--clip-grad"),
    (["--clip-grad", "nan"], "--clip-grad"),
    (["--uneven", "--global-batch", "7000"], "global batch 7000 exceeds"),  # UnevenSampler
    (["--uneven", "--comm-hook", "bf16", "--dtype", "float32"], "--comm-hook bf16 with --uneven"),
])
def test_the_trainers_new_flags_are_checked_before_training(argv, words, capsys, tmp_path):
    refused_before_training(argv, words, capsys, tmp_path)
    args = gpt_trainer().parse_args(["--uneven", "--clip-grad", "2.5"])
    assert args.uneven and args.clip_grad == 2.5
