"""Deterministic mode's micro-shards side by side: one forward and one backward, the bits
of one backward per micro-shard.

``ddp.forward(x, micro_shards=K)`` on a model whose backward takes ``part_grads`` (the
GPT's, `protocol.py`): each shard's parameter gradients land in a part of their own
(`determinism.part_grads`). The oracle is the loop it replaces, one forward and backward
per micro-shard inside ``no_sync()``: gradients, parameters and optimizer state must be
`np.array_equal` to it, on one rank, on several, and inside ``join()`` with ranks joined
(whose exact average must count the shards, not the forwards).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from mpidp.training import GPT, MLP, Adam, DataParallel
from mpidp.training.gpt import token_cross_entropy

V, T = 23, 8  # vocabulary, context
SIZE = {"n_layer": 2, "n_head": 2, "width": 16}


def tokens(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (n, T)), rng.integers(0, V, (n, T))


@pytest.fixture(autouse=True)
def one_blas_thread():
    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k, m", [(1, 3), (3, 1), (2, 2), (4, 3)])
def test_a_gpt_backward_of_k_shards_writes_each_shards_gradient_bitwise(dtype, k, m):
    model = GPT(V, T, dtype=dtype, seed=1, **SIZE)
    x, y = tokens(k * m)
    want = []
    for s in range(k):  # the oracle: one forward and backward per shard
        rows = slice(s * m, (s + 1) * m)
        _, dlogits = token_cross_entropy(model.forward(x[rows]), y[rows])
        model.backward(dlogits)
        want.append({n: g.copy() for n, g in model.grads.items()})
    parts = [{n: np.full_like(g, np.nan) for n, g in model.grads.items()} for _ in range(k - 1)]
    _, dlogits = token_cross_entropy(model.forward(x), y, shards=k)
    model.backward(dlogits, part_grads=parts)
    for s, got in enumerate([*parts, model.grads]):
        for name in model.grads:
            assert np.array_equal(got[name], want[s][name]), (s, name)


def test_the_loss_of_k_shards_is_their_mean_and_its_gradient_each_shards():
    model = GPT(V, T, dtype="float64", seed=1, **SIZE)
    x, y = tokens(6)
    logits = model.forward(x)
    loss, d = token_cross_entropy(logits, y, shards=3)
    each = [token_cross_entropy(logits[2 * s:2 * s + 2], y[2 * s:2 * s + 2]) for s in range(3)]
    assert np.array_equal(d, np.concatenate([g for _, g in each]))
    assert loss == pytest.approx(np.mean([v for v, _ in each]), rel=1e-12)
    with pytest.raises(ValueError, match="6 samples do not split into 4 micro-shards"):
        token_cross_entropy(logits, y, shards=4)


def train(comm, k: int, m: int, together: bool, zero: int = 0, steps: int = 2,
          counts=None) -> dict:
    """Deterministic AdamW steps of a GPT on `comm`, each rank's K micro-shards of M samples
    side by side (``together``) or one forward and backward each; the parameters and the
    optimizer state after. ``counts``: rank r trains counts[r] steps, inside ``join()``."""
    rank, n = comm.Get_rank(), comm.Get_size()
    model = GPT(V, T, dtype="float32", seed=rank, **SIZE)  # the broadcast makes them one
    opt = Adam(model.params, model.grads, lr=0.01, weight_decay=0.01)
    mine = steps if counts is None else counts[rank]
    x, y = tokens(steps * n * k * m, seed=5)
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
                        _, dlogits = token_cross_entropy(logits, y[rows], k if together else 1)
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


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("k, m", [(3, 1), (2, 3)])
def test_one_forward_of_k_shards_equals_k_forwards_on_one_rank(zero, k, m):
    want = train(MPI.COMM_SELF, k, m, together=False, zero=zero)
    assert_same(train(MPI.COMM_SELF, k, m, together=True, zero=zero), want, f"zero {zero}")


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
    mlp = MLP([4, 3, 2], dtype="float32")
    with DataParallel(mlp, MPI.COMM_SELF, deterministic=True) as ddp:
        with pytest.raises(TypeError, match="MLP's backward does not keep micro-shards apart"):
            ddp.forward(np.zeros((4, 4), np.float32), micro_shards=2)
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


@pytest.mark.mpi(ranks=[3], timeout=180)
def test_shards_side_by_side_on_three_ranks_and_with_ranks_joined(mpi_ranks):
    """3 ranks, K = 2 shards side by side, equal one rank's loop over the same 6 shards a
    step; inside join() (rank 1 trains 1 step, the others 2), one rank's loop over each
    step's union (the second step's 4 shards: the exact average counts them, not the
    forwards)."""
    world = MPI.COMM_WORLD
    got = train(world, 2, 2, together=True, zero=1)
    want = train(MPI.COMM_SELF, 6, 2, together=False)  # step s: ranks 0, 1, 2's shards
    assert_same(got, want, "3 ranks, ZeRO 1")
    counts = [2, 1, 2]
    got = train(world, 2, 2, together=True, counts=counts)
    model = GPT(V, T, dtype="float32", seed=0, **SIZE)
    opt = Adam(model.params, model.grads, lr=0.01, weight_decay=0.01)
    x, y = tokens(2 * 3 * 4, seed=5)
    with DataParallel(model, MPI.COMM_SELF, optimizer=opt, deterministic=True) as ddp:
        for step in range(2):
            shards = [slice((step * 3 + r) * 4 + s * 2, (step * 3 + r) * 4 + s * 2 + 2)
                      for r in range(3) if step < counts[r] for s in range(2)]
            for a, rows in enumerate(shards):
                with ddp.no_sync() if a < len(shards) - 1 else nullcontext():
                    _, d = token_cross_entropy(ddp.forward(x[rows]), y[rows])
                    ddp.backward(d)
            ddp.step()
        for name, p in model.params.items():
            assert np.array_equal(got[f"param/{name}"], p), f"join(): {name}"
