"""Deterministic mode's micro-shards side by side: one forward and one backward, the bits
of one backward per micro-shard.

``ddp.forward(x, micro_shards=K)`` on a model whose backward takes ``part_grads`` (the
GPT's and the MLP's, `protocol.py`): each shard's parameter gradients land in a part of
their own (`determinism.part_grads`). The oracle is the loop it replaces, one forward and backward
per micro-shard inside ``no_sync()``: gradients, parameters and optimizer state must be
`np.array_equal` to it, on one rank, on several, and inside ``join()`` with ranks joined
(whose exact average must count the shards, not the forwards).
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
from helpers import launch
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from mpidp.training import GPT, MLP, Adam, DataParallel, softmax_cross_entropy
from mpidp.training.determinism import PartGrads
from mpidp.training.gpt import token_cross_entropy

V, T = 23, 8  # the GPT's vocabulary, context
SIZE = {"n_layer": 2, "n_head": 2, "width": 16}
WIDTHS = [6, 9, 7, 5]  # the MLP's
KINDS = ("gpt", "mlp")


def make(kind: str, seed: int = 0, dtype: str = "float32"):
    if kind == "gpt":
        return GPT(V, T, dtype=dtype, seed=seed, **SIZE)
    return MLP(WIDTHS, dtype=dtype, seed=seed)


def tokens(n: int, seed: int = 0, kind: str = "gpt", dtype: str = "float32"):
    """n samples and their targets: the GPT's token ids, the MLP's features and classes."""
    rng = np.random.default_rng(seed)
    if kind == "gpt":
        return rng.integers(0, V, (n, T)), rng.integers(0, V, (n, T))
    return rng.standard_normal((n, WIDTHS[0])).astype(dtype), rng.integers(0, WIDTHS[-1], n)


def loss(kind: str, logits, y, k: int = 1):
    return (token_cross_entropy if kind == "gpt" else softmax_cross_entropy)(logits, y, k)


@pytest.fixture(autouse=True)
def one_blas_thread():
    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k, m", [(1, 3), (3, 1), (2, 2), (4, 3), (3, 8)])
def test_a_backward_of_k_shards_writes_each_shards_gradient_bitwise(kind, dtype, k, m):
    model = make(kind, 1, dtype)
    x, y = tokens(k * m, kind=kind, dtype=dtype)
    want = []
    for s in range(k):  # the oracle: one forward and backward per shard
        rows = slice(s * m, (s + 1) * m)
        _, dlogits = loss(kind, model.forward(x[rows].copy()), y[rows])
        model.backward(dlogits)
        want.append({n: g.copy() for n, g in model.grads.items()})
    parts = [{n: np.full_like(g, np.nan) for n, g in model.grads.items()} for _ in range(k - 1)]
    _, dlogits = loss(kind, model.forward(x, micro_batches=k), y, k)
    model.backward(dlogits, part_grads=parts)
    for s, got in enumerate([*parts, model.grads]):
        for name in model.grads:
            assert np.array_equal(got[name], want[s][name]), (s, name)


@pytest.mark.parametrize("widths", [WIDTHS, [64, 128, 64, 10]])  # the MLP trainer's too
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [2, 4, 5])
def test_parts_that_are_rows_of_one_array_are_written_by_one_product_with_the_same_bits(
        widths, dtype, k):
    """`part_grads` lays the K - 1 parts out as rows of one array (``stacked``), and the
    MLP writes them with one batched product: written, and added to (``accumulate``),
    each shard's gradients bitwise a backward of it alone."""
    model = MLP(widths, dtype=dtype, seed=2)
    rng = np.random.default_rng(k)
    x, y = rng.standard_normal((8 * k, widths[0])).astype(dtype), rng.integers(0, widths[-1], 8 * k)
    start = {n: rng.standard_normal(g.shape).astype(dtype) for n, g in model.grads.items()}
    want = {False: [], True: []}
    for s in range(k):  # the oracle: one forward and backward per shard, alone
        rows = slice(s * 8, (s + 1) * 8)
        for accumulate in (False, True):
            for n, g in model.grads.items():
                g[...] = start[n]
            logits = model.forward(x[rows].copy())
            model.backward(loss("mlp", logits, y[rows])[1], accumulate=accumulate)
            want[accumulate].append({n: g.copy() for n, g in model.grads.items()})
    sizes = {n: g.size for n, g in model.grads.items()}
    for accumulate in (False, True):
        rows = np.zeros((k - 1, sum(sizes.values()) + 3), dtype)  # rows of one array
        at = np.cumsum([0, *sizes.values()])
        stacked = {n: rows[:, a:a + g.size].reshape(k - 1, *g.shape)
                   for (n, g), a in zip(model.grads.items(), at, strict=False)}
        parts = PartGrads([{n: v[j] for n, v in stacked.items()} for j in range(k - 1)],
                          stacked)
        for n, g in model.grads.items():
            g[...] = start[n]
            stacked[n][...] = start[n]
        _, dlogits = loss("mlp", model.forward(x, micro_batches=k), y, k)
        model.backward(dlogits, part_grads=parts, accumulate=accumulate)
        for s, got in enumerate([*parts, model.grads]):
            for name in model.grads:
                assert np.array_equal(got[name], want[accumulate][s][name]), (s, name)


def test_the_loss_of_k_shards_is_their_mean_and_its_gradient_each_shards():
    model = GPT(V, T, dtype="float64", seed=1, **SIZE)
    x, y = tokens(6)
    logits = model.forward(x)
    loss, d = token_cross_entropy(logits, y, micro_batches=3)
    each = [token_cross_entropy(logits[2 * s:2 * s + 2], y[2 * s:2 * s + 2]) for s in range(3)]
    assert np.array_equal(d, np.concatenate([g for _, g in each]))
    assert loss == pytest.approx(np.mean([v for v, _ in each]), rel=1e-12)
    with pytest.raises(ValueError, match="6 samples do not split into 4 micro-batches"):
        token_cross_entropy(logits, y, micro_batches=4)


def train(comm, k: int, m: int, together: bool, zero: int = 0, steps: int = 2,
          counts=None, kind: str = "gpt") -> dict:
    """Deterministic AdamW steps of a GPT (an MLP) on `comm`, each rank's K micro-shards of
    M samples side by side (``together``) or one forward and backward each; the parameters
    and the optimizer state after. ``counts``: rank r trains counts[r] steps, inside ``join()``."""
    rank, n = comm.Get_rank(), comm.Get_size()
    model = make(kind, seed=rank)  # the broadcast makes them one
    opt = Adam(model.params, model.grads, lr=0.01, weight_decay=0.01)
    mine = steps if counts is None else counts[rank]
    x, y = tokens(steps * n * k * m, seed=5, kind=kind)
    with DataParallel(model, comm, bucket_mb=0.01, algorithm="ring", optimizer=opt,
                      zero=zero, deterministic=True) as ddp:
        with ddp.join() if counts is not None else nullcontext():
            for step in range(mine):
                at = (step * n + rank) * k * m  # this rank's K·M samples of this step
                shards = [slice(at, at + k * m)] if together else [
                    slice(at + s * m, at + (s + 1) * m) for s in range(k)]
                for a, rows in enumerate(shards):
                    with ddp.no_sync() if a < len(shards) - 1 else nullcontext():
                        logits = ddp.forward(x[rows], micro_shards=k if together else 1)
                        _, dlogits = loss(kind, logits, y[rows], k if together else 1)
                        ddp.backward(dlogits)
                ddp.step()
        ddp.check_replicas()
        opt = ddp.full_optimizer() if zero else ddp.optimizer
        with ddp.gathered() as params:
            out = {f"param/{n}": p.copy() for n, p in params.items()}
        out.update({f"opt/{key}": np.array(value) for key, value in opt.state_dict().items()})
    return out


def assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), what
    assert any(name.startswith("opt/") for name in want), list(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), f"{what}: {name}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("k, m", [(3, 1), (2, 3)])
def test_one_forward_of_k_shards_equals_k_forwards_on_one_rank(kind, zero, k, m):
    want = train(MPI.COMM_SELF, k, m, together=False, zero=zero, kind=kind)
    got = train(MPI.COMM_SELF, k, m, together=True, zero=zero, kind=kind)
    assert_same(got, want, f"{kind}, zero {zero}")


def test_shards_side_by_side_inside_no_sync_are_kept_with_the_later_ones():
    """Two forwards of 2 shards each (the first inside no_sync()) equal 4 forwards of 1."""
    want = train(MPI.COMM_SELF, 4, 1, together=False)
    model = GPT(V, T, dtype="float32", seed=0, **SIZE)
    opt = Adam(model.params, model.grads, lr=0.01, weight_decay=0.01)
    x, y = tokens(8, seed=5)
    with DataParallel(model, MPI.COMM_SELF, bucket_mb=0.01, algorithm="ring", optimizer=opt,
                      deterministic=True) as ddp:
        for step in range(2):
            for half in range(2):
                rows = slice(step * 4 + half * 2, step * 4 + half * 2 + 2)
                with ddp.no_sync() if half == 0 else nullcontext():
                    _, d = token_cross_entropy(ddp.forward(x[rows], micro_shards=2), y[rows], 2)
                    ddp.backward(d)
            ddp.step()
        for name, p in model.params.items():
            assert np.array_equal(p, want[f"param/{name}"]), name


def test_micro_shards_are_refused_where_they_cannot_be_kept_apart():
    x, _ = tokens(4)
    gpt = GPT(V, T, dtype="float32", **SIZE)
    with DataParallel(gpt, MPI.COMM_SELF) as ddp:
        with pytest.raises(ValueError, match="micro_shards is deterministic mode's"):
            ddp.forward(x, micro_shards=2)
    with DataParallel(Plain(), MPI.COMM_SELF, deterministic=True) as ddp:
        with pytest.raises(TypeError, match="Plain's backward does not keep micro-batches apart"):
            ddp.forward(np.zeros((4, 4), np.float32), micro_shards=2)
    mlp = MLP(WIDTHS)
    mlp.forward(np.zeros((6, WIDTHS[0]), np.float32), micro_batches=3)
    with pytest.raises(ValueError, match="part_grads: 1 dicts, for a forward of"):
        mlp.backward(np.zeros((6, WIDTHS[-1]), np.float32), part_grads=[dict(mlp.grads)])
    with pytest.raises(ValueError, match="7 samples do not split into 2"):
        mlp.forward(np.zeros((7, WIDTHS[0]), np.float32), micro_batches=2)
    opt = Adam(gpt.params, gpt.grads, lr=0.01)
    with DataParallel(gpt, MPI.COMM_SELF, deterministic=True, zero=2, optimizer=opt) as ddp:
        with pytest.raises(ValueError, match="ZeRO stage 2 makes each bucket during backward"):
            ddp.forward(x, micro_shards=2)
    with DataParallel(GPT(V, T, dtype="float32", **SIZE), MPI.COMM_SELF,
                      deterministic=True) as ddp:
        with pytest.raises(ValueError, match="4 samples do not split into 3 equal"):
            ddp.forward(x, micro_shards=3)
        for bad in (0, 2.0, True):
            with pytest.raises(ValueError, match="an int >= 1"):
                ddp.forward(x, micro_shards=bad)
    logits = np.zeros((6, 3))
    for bad in (4, 0, True):
        with pytest.raises(ValueError, match="6 rows do not split into micro_batches="):
            softmax_cross_entropy(logits, np.zeros(6, int), bad)


def test_the_parts_are_kept_for_the_next_steps_and_counted():
    """K - 1 parts of every bucket, made at the first step, reused after (a NumPy int K
    too), and what they hold is `parts_bytes` (the MLP trainer's peak memory adds it)."""
    model = make("mlp")
    x, y = tokens(6, kind="mlp")
    with DataParallel(model, MPI.COMM_SELF, bucket_mb=0.0, deterministic=True) as ddp:
        assert ddp.parts_bytes == 0
        for _ in range(2):
            ddp.backward(loss("mlp", ddp.forward(x, micro_shards=np.int64(3)), y, 3)[1])
            assert ddp.parts_bytes == 2 * sum(b.flat.nbytes for b in ddp.buckets) > 0
        assert len(ddp.apart.kept) == 1


class Plain(MLP):
    """An MLP that does not say it keeps micro-batches apart (protocol.py's optional part)."""

    micro_batches_apart = False

    def __init__(self):
        super().__init__([4, 3, 2])


@pytest.mark.mpi(ranks=[3], timeout=180)
@pytest.mark.parametrize("kind", KINDS)
def test_shards_side_by_side_on_three_ranks_and_with_ranks_joined(mpi_ranks, kind):
    """3 ranks, K = 2 shards side by side, equal one rank's loop over the same 6 shards a
    step; inside join() (rank 1 trains 1 step, the others 2), one rank's loop over each
    step's union (the second step's 4 shards: the exact average counts them, not the
    forwards)."""
    world = MPI.COMM_WORLD
    got = train(world, 2, 2, together=True, zero=1, kind=kind)
    want = train(MPI.COMM_SELF, 6, 2, together=False, kind=kind)  # ranks 0, 1, 2's shards
    assert_same(got, want, "3 ranks, ZeRO 1")
    counts = [2, 1, 2]
    got = train(world, 2, 2, together=True, counts=counts, kind=kind)
    model = make(kind)
    opt = Adam(model.params, model.grads, lr=0.01, weight_decay=0.01)
    x, y = tokens(2 * 3 * 4, seed=5, kind=kind)
    with DataParallel(model, MPI.COMM_SELF, optimizer=opt, deterministic=True) as ddp:
        for step in range(2):
            shards = [slice((step * 3 + r) * 4 + s * 2, (step * 3 + r) * 4 + s * 2 + 2)
                      for r in range(3) if step < counts[r] for s in range(2)]
            for a, rows in enumerate(shards):
                with ddp.no_sync() if a < len(shards) - 1 else nullcontext():
                    _, d = loss(kind, ddp.forward(x[rows]), y[rows])
                    ddp.backward(d)
            ddp.step()
        for name, p in model.params.items():
            assert np.array_equal(got[f"param/{name}"], p), f"join(): {name}"


def test_a_traced_dataparallel_takes_micro_shards_and_traces_the_step(tmp_path):
    """The tracer wraps ddp.forward (`Tracer.follow`): it must pass micro_shards on (it did
    not: --deterministic --trace failed at the first step)."""
    from mpidp import trace

    want = train(MPI.COMM_SELF, 3, 1, together=False, kind="mlp", steps=1)
    model = make("mlp")
    opt = Adam(model.params, model.grads, lr=0.01, weight_decay=0.01)
    x, y = tokens(3, seed=5, kind="mlp")
    tracer = trace.Tracer(0)
    with DataParallel(model, MPI.COMM_SELF, bucket_mb=0.01, algorithm="ring", optimizer=opt,
                      deterministic=True) as ddp:
        tracer.follow(ddp)
        ddp.backward(loss("mlp", ddp.forward(x, micro_shards=3), y, 3)[1])
        ddp.step()
    for name, p in model.params.items():
        assert np.array_equal(p, want[f"param/{name}"]), name
    path = str(tmp_path / "t.json")
    tracer.write(path)
    names = {e["name"] for e in json.load(open(path))["traceEvents"]}
    assert {"forward L1", "backward L1", "allreduce bucket 0"} <= names, names


@pytest.mark.parametrize("kind, looped", [("mlp", False), ("gpt", False), ("mlp", True)])
def test_the_step_timing_tool_runs_and_times_the_parts(kind, looped):
    """tools/determ_step.py (the figures of docs/benchmarks-notes.md) on 2 ranks, 2 steps:
    it patches the functions it times by name, so a move of one of them broke it (the
    parts' `part_grads` left ddp.py), and it refuses to print a part whose function was
    never called (patched under a name nothing calls it by)."""
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, str(root / "tools" / "determ_step.py"), kind, "--steps", "2",
            "--warmup", "1", *(["--looped"] if looped else [])]
    code, out, err, _ = launch.run(2, argv, timeout=120, cwd=str(root))
    assert code == 0, (code, out, err)
    assert re.search(rf"^{kind} deterministic +A=\d+ step \d+\.\d+ .* keep \d", out, re.M), out
    assert re.search(rf"^{kind} ratio \d+\.\d+x \({'looped' if looped else 'side by side'}\)",
                     out, re.M), out
