"""Deterministic data parallelism: N ranks give the bits of one rank on the global batch.

`DataParallel(..., deterministic=True)`: every backward is one micro-shard of M
samples; the synced backward launches the exact average of every micro-shard on
every rank (`mpidp.iallreduce_parts`). The oracle is one rank on `MPI.COMM_SELF`
running the same micro-shards of the same global batch: parameters and optimizer
state must be `np.array_equal` to it after every step, whatever the rank count,
algorithm, bucket layout, overlap or ZeRO stage.

The settings are crossed pairwise (every pair of values of any two settings at least
once), by a fixed greedy cover of the whole product: one MPI launch of 8 ranks runs the
rows of each rank count on a communicator of that size, and the 1-rank reference of a
(dtype, optimizer, M) is computed once (that it need not depend on the rest is the
claim under test).
"""

from __future__ import annotations

import itertools
import os
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from mpi4py import MPI
from test_checkpoint import trainer
from threadpoolctl import threadpool_limits

import mpidp
from mpidp import watchdog
from mpidp.training import (
    MLP,
    SGD,
    Adam,
    DataParallel,
    ShardSampler,
    determinism,
    softmax_cross_entropy,
)
from mpidp.training.buckets import Bucket
from mpidp.training.checkpoint import read

SIZES = [10, 16, 12, 5]  # 3 layers: 3 buckets with bucket_mb=0, more with a small cap
GLOBAL_BATCH, STEPS = 24, 2  # 24 = lcm of 1, 2, 3, 4, 6, 8: every rank count below
RANKS = (1, 2, 3, 4, 6)  # crossed pairwise with the rest; 8 ranks: `rows_for`
SMALL_MB = 300 * 8 / 2**20  # 300 float64 (600 float32): buckets cut inside the model
OPTIMIZERS = {
    "sgd": lambda m: SGD(m.params, m.grads, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda m: Adam(m.params, m.grads, lr=0.01, weight_decay=0.01),
}
# (ZeRO stage, algorithm): every all-reduce algorithm, and ZeRO 1/2 with every pair of
# halves it accepts (the names of zero.HALVES, and explicit reduce-scatter/all-gather)
HALF_PAIRS = ["auto", "ring", "rabenseifner",
              {"reduce_scatter": "ring", "allgather": "recursive_doubling"},
              {"reduce_scatter": "recursive_halving", "allgather": "ring"}]
MODES = ([(0, a) for a in mpidp.ALGORITHMS["allreduce"]]
         + [(z, h) for z in (1, 2) for h in HALF_PAIRS])
FACTORS = {
    "ranks": RANKS,
    "mode": tuple(range(len(MODES))),
    "dtype": ("float32", "float64"),
    "optimizer": ("sgd", "adam"),
    "overlap": (True, False),
    "shards": ("one", "several"),  # micro-shards per rank: 1 (no no_sync) or more
    "bucket_mb": (0.0, SMALL_MB, 25.0),
}


def pairwise(factors: dict) -> list[dict]:
    """A fixed set of rows covering every pair of values of every two factors.

    Greedy: of the whole product, in order, take the row covering the most pairs not
    yet covered, until none is left (the first such row on a tie: deterministic).
    """
    names, sizes = list(factors), [len(v) for v in factors.values()]
    rows = np.array(list(itertools.product(*map(range, sizes))))  # value indices
    ids, offset = [], 0  # every (factor i, value a, factor j, value b) numbered
    for i, j in itertools.combinations(range(len(sizes)), 2):
        ids.append(offset + rows[:, i] * sizes[j] + rows[:, j])
        offset += sizes[i] * sizes[j]
    ids = np.stack(ids, axis=1)  # (rows, pairs of factors): the pairs each row covers
    todo = np.ones(offset, bool)
    chosen = []
    while todo.any():
        best = int(np.argmax(todo[ids].sum(axis=1)))  # argmax: the first on a tie
        todo[ids[best]] = False
        chosen.append({n: factors[n][v] for n, v in zip(names, rows[best], strict=True)})
    return chosen


def micro_batch(n: int, shards: str) -> int:
    """M for n ranks: the whole rank batch (one micro-shard), or its smallest divisor
    leaving at least 2 (3 on 8 ranks, whose batch is 3: M = 1)."""
    local = GLOBAL_BATCH // n
    if shards == "one":
        return local
    return next(m for m in range(1, local + 1) if local % m == 0 and local // m >= 2)


def dataset(dtype):
    rng = np.random.default_rng(42)
    n = STEPS * GLOBAL_BATCH
    return rng.standard_normal((n, SIZES[0])).astype(dtype), rng.integers(0, SIZES[-1], n)


def snapshot(ddp, model) -> dict:
    """Parameters and the whole optimizer state (ZeRO: gathered, collective), copied."""
    opt = ddp.full_optimizer() if ddp.zero else ddp.optimizer
    out = {f"param/{k}": v.copy() for k, v in model.params.items()}
    for key, value in opt.state_dict().items():
        if isinstance(value, np.ndarray):
            out[f"opt/{key}"] = value.copy()
        elif isinstance(value, dict):
            out.update({f"opt/{key}/{k}": np.array(v, copy=True) for k, v in value.items()})
        else:
            out[f"opt/{key}"] = np.array(value)
    return out


def train(comm, dtype: str, optimizer: str, m: int, zero: int = 0, algorithm="ring",
          **ddp_kw) -> list[dict]:
    """Deterministic training over STEPS global batches; a snapshot after every step.

    Every rank starts from other weights (the broadcast must fix that); each micro-shard
    is a contiguous copy of M rows, as in examples/train_mlp.py.
    """
    rank, n = comm.Get_rank(), comm.Get_size()
    x, y = dataset(dtype)
    k = determinism.micro_shards(GLOBAL_BATCH, n, m)
    sampler = ShardSampler(len(y), GLOBAL_BATCH, rank, n, seed=7, accum_steps=k)
    model = MLP(SIZES, dtype=dtype, seed=rank)
    snaps = []
    with DataParallel(model, comm, zero=zero, algorithm=algorithm,
                      optimizer=OPTIMIZERS[optimizer](model), deterministic=True,
                      **ddp_kw) as ddp:
        for shards in sampler.epoch(0):  # (K, M)
            for a, idx in enumerate(shards):
                with ddp.no_sync() if a < k - 1 else nullcontext():
                    _, dlogits = softmax_cross_entropy(ddp.forward(x[idx]), y[idx])
                    ddp.backward(dlogits)  # no 1/K: DataParallel averages the micro-shards
            ddp.step()
            snaps.append(snapshot(ddp, model))
        ddp.check_replicas()
    return snaps


def assert_bitwise(got: list[dict], want: list[dict], what: str) -> None:
    assert len(got) == len(want) == STEPS, what
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys(), what
        for key in w:
            assert g[key].dtype == w[key].dtype, f"{what}: step {step + 1} {key}"
            if not np.array_equal(g[key], w[key]):
                worst = np.max(np.abs(g[key].astype(np.float64) - w[key]))
                pytest.fail(f"{what}: step {step + 1} {key} differs from one rank "
                            f"(max |diff| {worst:.3g})")


ROWS = pairwise(FACTORS)


EIGHT = [  # 8 ranks (2 cores run 8 processes slowly): a few rows, each value of each setting
    (0, "ring", "float64", "sgd", True, "several", 0.0),
    (0, "recursive_doubling", "float32", "adam", False, "one", SMALL_MB),
    (0, "auto", "float64", "adam", True, "several", 25.0),
    (1, "rabenseifner", "float32", "sgd", False, "several", 0.0),
    (2, "auto", "float64", "sgd", True, "one", SMALL_MB),
    (2, HALF_PAIRS[3], "float32", "adam", False, "several", 25.0),
]


def rows_for(n: int) -> list[dict]:
    """The rows an n-rank launch runs: its share of the cover, or `EIGHT`."""
    if n != 8:
        return [r for r in ROWS if r["ranks"] == n]
    names = [k for k in FACTORS if k not in ("ranks", "mode")]
    return [{"ranks": 8, "mode": MODES.index((z, a)), **dict(zip(names, rest, strict=True))}
            for z, a, *rest in EIGHT]


def test_the_rows_cover_every_pair_and_every_rank_count_runs_every_value():
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        seen = {(r[a], r[b]) for r in ROWS}
        assert seen == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)
    assert len(ROWS) < 150  # a cover, not the product (10080 rows)
    eight = rows_for(8)
    for name in FACTORS:
        if name not in ("ranks", "mode"):
            assert {r[name] for r in eight} == set(FACTORS[name]), name


def references(comm, keys: list) -> dict:
    """The 1-rank run of every (dtype, optimizer, M), each on MPI.COMM_SELF of one rank
    (the ranks share the work), sent to all."""
    rank, n = comm.Get_rank(), comm.Get_size()
    mine = {key: train(MPI.COMM_SELF, *key) for key in keys[rank::n]}
    return {key: snaps for part in comm.allgather(mine) for key, snaps in part.items()}


@pytest.mark.mpi(ranks=[8], timeout=600)
def test_n_ranks_equal_one_rank_bitwise_after_every_step(mpi_ranks):
    """One launch of 8 ranks: each rank count's rows on a communicator of that size
    (tests/helpers/subcomms.py); the references of every size computed once, by all."""
    sizes = [*RANKS, 8]
    rows = {n: rows_for(n) for n in sizes}
    keys = {n: [(r["dtype"], r["optimizer"], micro_batch(n, r["shards"])) for r in rows[n]]
            for n in sizes}
    with threadpool_limits(1, user_api="blas"):
        expected = references(MPI.COMM_WORLD, sorted({k for ks in keys.values() for k in ks}))

        def check(comm):
            n = comm.Get_size()
            for row, key in zip(rows[n], keys[n], strict=True):
                zero, algorithm = MODES[row["mode"]]
                got = train(comm, *key, zero=zero, algorithm=algorithm,
                            overlap=row["overlap"], bucket_mb=row["bucket_mb"])
                assert_bitwise(got, expected[key], f"{n} ranks, M={key[2]}, {row}")

        on_each_size(sizes, check)


# ------------------------------------------------------------------ the refusals


def test_a_bucket_s_ordered_sum_is_planned_once_for_the_same_arrays_and_anew_for_others(
        monkeypatch):
    """`average_parts` plans a bucket's sum once where its parts are the same arrays at
    every step (b.flat, after `part_grads`' buffers), and anew where they or `out` are
    others (another K's buffers, none); `keep_apart`'s copies, a bucket that is not
    fixed, or a step with ranks joined are planned at each launch. Every result is the
    plain ordered average's on the same values, the persistent one's included."""
    made = {"allreduce": 0, "reduce_scatter": 0}

    def counting(name, real):
        def init(*args, **kw):
            made[name] += 1
            return real(*args, **kw)
        return init

    for name in made:
        attr = f"{name}_parts_init"
        monkeypatch.setattr(mpidp.collectives, attr,
                            counting(name, getattr(mpidp.collectives, attr)))
    comm, rng = MPI.COMM_SELF.Dup(), np.random.default_rng(3)
    flat = np.empty(50)
    b = Bucket(0, [0], ["w"], flat)
    four, two = [np.empty(50) for _ in range(3)], [np.empty(50)]

    def step(spares, parts=None, rs=False, out=None, **kw):
        b.spares, b.parts = spares, list(spares if parts is None else parts)
        for x in [*b.parts, flat]:
            x[...] = rng.standard_normal(50) * 10.0 ** rng.integers(-8, 8, 50)
        want = np.empty(50)
        mpidp.allreduce_parts(comm, [*b.parts, flat], want, addends=len(b.parts) + 1,
                              average=True, ordered=True)
        if out is None:  # in place; ZeRO's out: a new view of the block each step
            out = flat[:50] if rs else flat
        determinism.average_parts(comm, b, out, "auto", [50] if rs else None, **kw).wait()
        assert np.array_equal(out, want)
        return made["allreduce"], made["reduce_scatter"]

    assert step(four, fixed=True) == (1, 0)
    assert step(four, fixed=True) == (1, 0)  # the same arrays: started again
    assert step(two, fixed=True) == (2, 0)  # another K's buffers: planned anew
    assert step(two, [np.empty(50)], fixed=True) == (2, 0)  # keep_apart's copies
    assert step(two, fixed=True) == (2, 0)
    assert step(two, fixed=True, out=np.empty(50)) == (3, 0)  # another out: planned anew
    assert step(two, fixed=True) == (4, 0)
    assert step((), fixed=True) == (5, 0)  # one part, b.flat alone
    assert step((), fixed=False) == (5, 0)  # b.flat made by each backward (ZeRO 2, 3)
    assert step((), fixed=True, uneven=(1, True)) == (5, 0)  # ranks joined
    assert step(two, rs=True, fixed=True) == (5, 1)
    assert step(two, rs=True, fixed=True) == (5, 1)
    b.plan.Free()
    comm.Free()


def test_the_micro_batch_must_divide_every_ranks_batch():
    assert determinism.micro_shards(60, 4, 5) == 3
    for args, words in [((60, 4, 4), "does not divide the per-rank batch 15"),
                        ((60, 7, 1), "does not split over 7 ranks"),
                        ((60, 1, 0), "at least 1")]:
        with pytest.raises(ValueError, match=words):
            determinism.micro_shards(*args)


def test_the_default_micro_batch_comes_from_the_global_batch_alone():
    assert [determinism.default_micro_batch(b) for b in (64, 60, 48, 24, 7)] == [8, 1, 2, 1, 1]
    for b in range(1, 200):  # every rank count <= 8 that splits B gets whole micro-shards
        m = determinism.default_micro_batch(b)
        for n in range(1, 9):
            if b % n == 0:
                assert determinism.micro_shards(b, n, m) >= 1


def fake_blas(monkeypatch, **lib):
    import threadpoolctl

    entry = {"user_api": "blas", "internal_api": "openblas", "num_threads": 1,
             "filepath": "/fake/libblas.so", **lib}
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [entry])


def test_two_blas_threads_mkl_without_cbwr_and_gpu_arrays_are_refused(monkeypatch):
    model = MLP([3, 2], dtype="float64")
    comm = MPI.COMM_SELF
    fake_blas(monkeypatch, num_threads=2)
    with pytest.raises(RuntimeError, match="one BLAS thread.*runs 2"):
        DataParallel(model, comm, deterministic=True)
    fake_blas(monkeypatch, internal_api="mkl")
    monkeypatch.delenv("MKL_CBWR", raising=False)
    with pytest.raises(RuntimeError, match="MKL_CBWR"):
        DataParallel(model, comm, deterministic=True)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    DataParallel(model, comm, deterministic=True).close()
    fake_blas(monkeypatch)
    cupy_like = SimpleNamespace(params=model.params, grads=model.grads, layers=model.layers,
                                xp=SimpleNamespace(__name__="cupy"))
    with pytest.raises(RuntimeError, match="NumPy arrays only"):
        DataParallel(cupy_like, comm, deterministic=True)


@pytest.mark.parametrize("argv, words", [
    (["--micro-batch", "2"], "pass --deterministic"),
    (["--deterministic", "--device", "gpu"], "CPU only"),
    (["--deterministic", "--blas-threads", "2"], "one BLAS thread"),
    (["--deterministic", "--accum-steps", "2"], "not --accum-steps"),
    (["--deterministic", "--micro-batch", "0"], "--micro-batch"),
    (["--deterministic", "--global-batch", "64", "--micro-batch", "5"],
     "micro-batch 5 does not divide the per-rank batch 64"),
])
def test_the_trainers_flags_are_checked_before_training(argv, words, capsys, tmp_path):
    refused_before_training(argv, words, capsys, tmp_path)


def refused_before_training(argv, words: str, capsys, tmp_path) -> None:
    """train_mlp.py with `argv` exits 2 with one line holding `words`, before it writes."""
    ck = tmp_path / "ck.npz"
    try:  # a bad flag returns 2; a problem found by every rank together exits with 2
        code = trainer().main([*argv, "--progress", "never", "--data", "synthetic",
                               "--checkpoint", str(ck)])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.splitlines()) == 1, err
    assert not ck.exists()


def test_the_trainer_defaults_the_micro_batch_from_the_global_batch():
    args = trainer().parse_args(["--deterministic", "--global-batch", "48"])
    assert args.micro_batch == 2 and args.accum_steps == 1


# ---------------------------------------------- the done-when, smaller


def run_trainer(comm, argv) -> None:
    module = trainer()
    args = module.parse_args(argv)
    with watchdog.guard("auto", "training") as dog, threadpool_limits(1, user_api="blas"):
        assert module.train(args, comm, dog) == 0


@pytest.mark.mpi(ranks=[4], timeout=240)
def test_the_trainer_leaves_the_same_checkpoint_on_1_2_3_and_4_ranks(mpi_ranks, shared_dir):
    """K ranks of `train_mlp.py --deterministic --micro-batch 5 --global-batch 60`: the
    4-rank world, then 1 + 3 and 2 + 2 ranks side by side (comm splits), per algorithm."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    common = ["--deterministic", "--micro-batch", "5", "--dtype", "float32", "--epochs", "1",
              "--max-steps", "3", "--global-batch", "60", "--hidden", "32", "--progress",
              "never"]
    for algorithm in ("auto", "ring", "rabenseifner", "recursive_doubling"):
        paths = {k: os.path.join(shared_dir, f"{algorithm}-{k}.npz") for k in (1, 2, 3, 4)}
        for colors in ([0, 0, 0, 0], [0, 1, 1, 1], [0, 0, 1, 1]):
            comm = world.Split(colors[rank], rank)
            path = paths[comm.Get_size()]
            run_trainer(comm, [*common, "--algorithm", algorithm, "--checkpoint", path])
            comm.Free()
        world.Barrier()  # every checkpoint is written
        states = {k: read(p) for k, p in sorted(paths.items())}
        assert sorted(states) == [1, 2, 3, 4]
        names = [n for n in states[1] if n.startswith(("param/", "optim/"))]
        assert any(n.startswith("optim/") for n in names), list(states[1])
        for k in (2, 3, 4):
            for name in names:
                assert np.array_equal(states[k][name], states[1][name]), (algorithm, k, name)


def gpt_trainer():
    """examples/train_gpt.py as a module (the examples folder is not a package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "train_gpt.py")
    spec = importlib.util.spec_from_file_location("train_gpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi(ranks=[4], timeout=240)
def test_the_gpt_trainer_leaves_the_same_checkpoint_on_1_3_and_4_ranks(mpi_ranks, shared_dir):
    """`train_gpt.py --deterministic` (a tiny GPT, its tied embedding included): the 4-rank
    world, then 1 + 3 ranks side by side; parameters and AdamW's state bitwise equal. Each
    rank's micro-shards go side by side in one forward (`DataParallel.forward`'s
    micro_shards), but under --zero 2 one forward each: a 4-rank world of that too."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    module = gpt_trainer()
    common = ["--deterministic", "--dtype", "float32", "--max-steps", "3", "--global-batch",
              "12", "--layers", "1", "--width", "16", "--heads", "2", "--context", "8",
              "--corpus-mb", "0.25", "--eval-every", "100", "--progress", "never"]
    paths = {k: os.path.join(shared_dir, f"gpt-{k}.npz") for k in (1, 3, 4, "4, --zero 2")}
    for colors, zero in (([0, 0, 0, 0], 0), ([0, 1, 1, 1], 0), ([0, 0, 0, 0], 2)):
        comm = world.Split(colors[rank], rank)
        key = f"{comm.Get_size()}, --zero 2" if zero else comm.Get_size()
        args = module.parse_args([*common, "--zero", str(zero), "--checkpoint", paths[key]])
        with watchdog.guard("auto", "training") as dog, threadpool_limits(1, user_api="blas"):
            assert module.train(args, comm, dog) == 0
        comm.Free()
    world.Barrier()  # every checkpoint is written
    states = {k: read(p) for k, p in paths.items()}
    names = [n for n in states[1] if n.startswith(("param/", "optim/"))]
    assert any(n.startswith("optim/") for n in names), list(states[1])
    for k in (3, 4, "4, --zero 2"):
        for name in names:
            assert np.array_equal(states[k][name], states[1][name]), (k, name)
