"""Global-norm clipping: `clip_grad_norm(ddp, max_norm)` on N ranks is one rank's clipping.

The norm is of the whole averaged gradient, each element counted once, whatever the
ZeRO stage; deterministic mode sums the squares exactly (bitwise on any N, checked
against `fractions.Fraction`). The oracle of the multi-rank test is one rank on the
global batch: float64 to rounding, deterministic bitwise.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from fractions import Fraction

import numpy as np
import pytest
from helpers.subcomms import on_each_size
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from threadpoolctl import threadpool_limits

from mpidp.training import MLP, SGD, DataParallel, ShardSampler, clip_grad_norm
from mpidp.training import softmax_cross_entropy as xent
from mpidp.training.clipping import exact_square_sum

SIZES = [6, 9, 7, 4]
GLOBAL_BATCH, M, STEPS = 60, 2, 2  # 60 / N for N = 1, 2, 3, 5: a multiple of M
MAX_NORM = 0.05  # below every step's norm here: the clipping acts
HYPER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
TOL = {"rtol": 1e-11, "atol": 1e-13}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=40),
       st.sampled_from(["float16", "float32", "float64"]), st.integers(0, 40))
def test_the_exact_square_sum_is_the_rounded_true_sum_wherever_it_is_cut(xs, dtype, cut):
    with np.errstate(over="ignore"):
        g = np.array(xs, dtype=np.float64).astype(dtype)
    g = g[np.isfinite(g)]  # what the cast to float16 or float32 left finite
    true = sum((Fraction(float(v)) ** 2 for v in g), Fraction(0))
    want = float(true) if true < Fraction(2) ** 1024 else math.inf  # rounded once
    assert exact_square_sum([g]) == want
    assert exact_square_sum([g[cut:], np.empty(0, dtype), g[:cut]]) == want
    assert exact_square_sum([g, np.array([np.inf], dtype)]) == math.inf
    assert math.isnan(exact_square_sum([np.array([np.nan, -np.inf], dtype), g]))


def test_max_norm_must_be_a_finite_number_above_zero():
    model = MLP(SIZES, dtype="float64", seed=0)
    with DataParallel(model, MPI.COMM_SELF) as ddp:
        for bad in (0, -1.0, math.nan, math.inf):
            with pytest.raises(ValueError, match="max_norm must be a finite number above 0"):
                clip_grad_norm(ddp, bad)


def dataset(dtype):
    rng = np.random.default_rng(5)
    n = STEPS * GLOBAL_BATCH
    return rng.standard_normal((n, SIZES[0])).astype(dtype), rng.integers(0, SIZES[-1], n)


def reference(deterministic: bool) -> tuple[list[float], dict]:
    """One rank: float64 on each global batch, or (deterministic, float32) DataParallel on
    COMM_SELF over its micro-shards; the norms of every step, the parameters after."""
    if deterministic:
        return train(MPI.COMM_SELF, 0, True)
    x, y = dataset("float64")
    model = MLP(SIZES, dtype="float64", seed=0)
    opt = SGD(model.params, model.grads, **HYPER)
    norms = []
    for idx in ShardSampler(len(y), GLOBAL_BATCH, seed=1).global_batches(0):
        model.backward(xent(model.forward(x[idx]), y[idx])[1])
        norms.append(math.sqrt(sum(float(np.vdot(g, g)) for g in model.grads.values())))
        for g in model.grads.values():
            g *= min(1.0, MAX_NORM / (norms[-1] + 1e-6))
        opt.step()
    return norms, {k: v.copy() for k, v in model.params.items()}


def train(comm, zero: int, deterministic: bool) -> tuple[list[float], dict]:
    rank, n = comm.Get_rank(), comm.Get_size()
    dtype = "float32" if deterministic else "float64"
    x, y = dataset(dtype)
    A = GLOBAL_BATCH // n // M if deterministic else 1
    sampler = ShardSampler(len(y), GLOBAL_BATCH, rank, n, seed=1, accum_steps=A)
    model = MLP(SIZES, dtype=dtype, seed=rank)
    opt = SGD(model.params, model.grads, **HYPER)
    norms = []
    with DataParallel(model, comm, algorithm="ring", optimizer=opt, zero=zero,
                      deterministic=deterministic, bucket_mb=0) as ddp:
        for micro in sampler.epoch(0):  # (A, b)
            for a, idx in enumerate(micro):
                with ddp.no_sync() if a < A - 1 else nullcontext():
                    ddp.backward(xent(ddp.forward(x[idx]), y[idx])[1])
            norms.append(clip_grad_norm(ddp, MAX_NORM))
            ddp.step()
        with ddp.gathered() as params:
            return norms, {k: v.copy() for k, v in params.items()}


@pytest.mark.mpi(ranks=[5], timeout=240)
def test_n_ranks_clip_as_one_rank_every_zero_stage(mpi_ranks):
    with threadpool_limits(1, user_api="blas"):
        want = {det: reference(det) for det in (False, True)}
        assert all(norm > MAX_NORM for norm in want[False][0])  # the clipping acts

        def check(comm):
            for zero in (0, 1, 2, 3):
                for det in (False, True):
                    what = f"N={comm.Get_size()} zero={zero} deterministic={det}"
                    norms, params = train(comm, zero, det)
                    if det:
                        assert norms == want[det][0], what
                        for k, v in want[det][1].items():
                            assert np.array_equal(params[k], v), f"{what} {k}"
                    else:
                        np.testing.assert_allclose(norms, want[det][0], **TOL, err_msg=what)
                        for k, v in want[det][1].items():
                            np.testing.assert_allclose(params[k], v, **TOL, err_msg=what)

        on_each_size((2, 3, 5), check)
