"""The model protocol of DataParallel (units, tied weights) and the GPT trained data-parallel.

The N-rank runs are checked against one process on the global batch, computed in
the same job on every rank (float64, rtol 1e-9): overlap on and off, gradient
accumulation, ZeRO stages 0, 1, 2 (and stage 1 with the prefetched all-gather),
one bucket per unit and one bucket for all, pairwise rather than every product.
"""

import json
from contextlib import nullcontext

import numpy as np
import pytest
from helpers.subcomms import on_each_size

from mpidp.training import GPT, MLP, AdamW, DataParallel, ShardSampler
from mpidp.training.buckets import make_buckets, units, writers
from mpidp.training.gpt import token_cross_entropy

CONFIG = {"vocab": 11, "context": 6, "n_layer": 2, "n_head": 2, "width": 8}
N_SEQ, GLOBAL_BATCH, EPOCHS = 48, 24, 2  # 2 steps per epoch
HYPER = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}
TOL = {"rtol": 1e-9, "atol": 1e-12}


# ---------------------------------------------------------------- the protocol, one process

class TiedMLP(MLP):
    """An MLP whose last layer also writes W1's gradient: a tied weight, for the protocol."""

    def names(self, i):
        return (*super().names(i), "W1") if i == self.layers else super().names(i)


def test_an_mlp_keeps_its_buckets_one_unit_per_layer():
    m = MLP([5, 4, 3, 2], dtype="float64")
    assert units(m) == [(3, ["W3", "b3"]), (2, ["W2", "b2"]), (1, ["W1", "b1"])]
    buckets = make_buckets(m, 0, 0)
    assert [(b.units, b.names) for b in buckets] == [([3], ["W3", "b3"]), ([2], ["W2", "b2"]),
                                                      ([1], ["W1", "b1"])]
    assert {i: [b.index for b in bs] for i, bs in writers(m, buckets).items()} == \
        {1: [2], 2: [1], 3: [0]}


def test_a_tied_weight_belongs_to_the_bucket_of_its_last_unit_and_is_written_from_its_first():
    m = TiedMLP([5, 4, 3, 2], dtype="float64")
    assert units(m) == [(3, ["W3", "b3"]), (2, ["W2", "b2"]), (1, ["W1", "b1"])]
    buckets = make_buckets(m, 0, 0)
    assert sum(b.names.count("W1") for b in buckets) == 1 and "W1" in buckets[2].names
    assert [b.index for b in writers(m, buckets)[3]] == [0, 2]  # W1's buffer made at unit 3
    gpt = GPT(**CONFIG, dtype="float64")
    buckets = make_buckets(gpt, 0, 0)
    assert buckets[0].names == ["lnf_g", "lnf_b"] and buckets[-1].names == ["wte", "wpe"]
    assert [b.index for b in writers(gpt, buckets)[gpt.layers]] == [0, len(buckets) - 1]
    all_names = [n for b in buckets for n in b.names]
    assert sorted(all_names) == sorted(gpt.params)  # each parameter in exactly one bucket
    one = make_buckets(GPT(**CONFIG, dtype="float64"), 25 << 20, 1 << 20)
    assert len(one) == 1 and one[0].units == [4, 3, 2, 1]


# ---------------------------------------------------------------- N ranks = 1 rank

def corpus():
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, CONFIG["vocab"], N_SEQ * CONFIG["context"] + 1)
    T = CONFIG["context"]
    x = np.stack([tokens[k * T:(k + 1) * T] for k in range(N_SEQ)])  # (n, T)
    y = np.stack([tokens[k * T + 1:(k + 1) * T + 1] for k in range(N_SEQ)])  # (n, T)
    return x, y


def reference() -> dict:
    x, y = corpus()
    model = GPT(**CONFIG, dtype="float64", seed=0)
    opt = AdamW(model.params, model.grads, **HYPER)
    sampler = ShardSampler(N_SEQ, GLOBAL_BATCH, seed=7)
    for epoch in range(EPOCHS):
        for idx in sampler.global_batches(epoch):
            _, dlogits = model.loss(x[idx], y[idx])
            model.backward(dlogits)
            opt.step()
    return model.params


def train(comm, accum=1, **ddp_kw) -> dict:
    x, y = corpus()
    rank, size = comm.Get_rank(), comm.Get_size()
    model = GPT(**CONFIG, dtype="float64", seed=rank)  # the broadcast must fix the weights
    opt = AdamW(model.params, model.grads, **HYPER)
    sampler = ShardSampler(N_SEQ, GLOBAL_BATCH, rank, size, seed=7, accum_steps=accum)
    with DataParallel(model, comm, optimizer=opt, **ddp_kw) as ddp:
        for epoch in range(EPOCHS):
            for micro_batches in sampler.epoch(epoch):  # (A, b)
                for a, idx in enumerate(micro_batches):
                    with ddp.no_sync() if a < accum - 1 else nullcontext():
                        _, dlogits = token_cross_entropy(ddp.forward(x[idx]), y[idx])
                        ddp.backward(dlogits / accum)  # (b, T, V)
                ddp.step()
                ddp.check_replicas()
        with ddp.gathered() as params:  # stage 3: only the shard is held between steps
            return {k: p.copy() for k, p in params.items()}


CASES = [  # pairwise: each of zero x overlap x accum x buckets appears with each other
    {"zero": 0, "overlap": True, "accum": 1, "bucket_mb": 0},
    {"zero": 0, "overlap": False, "accum": 2, "bucket_mb": 25},
    {"zero": 1, "overlap": True, "accum": 2, "bucket_mb": 0, "prefetch": True},
    {"zero": 1, "overlap": False, "accum": 1, "bucket_mb": 25},
    {"zero": 2, "overlap": True, "accum": 2, "bucket_mb": 25},
    {"zero": 2, "overlap": False, "accum": 1, "bucket_mb": 0},
    {"zero": 2, "overlap": True, "accum": 1, "bucket_mb": 0},
    # stage 3: a block gathered before it runs (the head gathers the tied embedding too)
    {"zero": 3, "overlap": True, "accum": 2, "bucket_mb": 25, "prefetch": True},
    {"zero": 3, "overlap": False, "accum": 1, "bucket_mb": 0},
]


@pytest.mark.mpi(ranks=[4], timeout=360)
def test_gpt_on_n_ranks_equals_one_rank_and_its_zero_memory_is_the_formula(mpi_ranks):
    """N = 1..4 in one launch: a communicator of each size (tests/helpers/subcomms.py);
    then, in the same launch, the ZeRO memory of the GPT (N = 3)."""
    expected = reference()

    def check(comm):
        for case in CASES:
            kw = dict(case)
            params = train(comm, accum=kw.pop("accum"), **kw)
            for name in expected:
                np.testing.assert_allclose(params[name], expected[name], **TOL,
                                           err_msg=f"N={comm.Get_size()} {case} {name}")

    on_each_size(range(1, 5), check)
    on_each_size((3,), check_zero_memory_of_the_gpt_is_the_formula)


def check_zero_memory_of_the_gpt_is_the_formula(comm):
    """Model states per rank, measured from the arrays (tied wte counted once), = the formula."""
    from mpidp.bench import gpt as bench

    args = bench.parse_args(["--layers", "1", "--heads", "2", "--width", "8", "--context", "8",
                             "--batch", "2", "--bucket-mb", "0"])
    rows = bench.memory(comm, args)
    assert [r["zero"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["total"] == r["formula"], r
    assert rows[0]["total"] > rows[1]["total"] > rows[2]["total"]


def test_the_gpt_bench_runs_and_reports_into_the_page(tmp_path):
    """One rank, one step per mode: the figures are there, and the page's tables come from them."""
    from mpidp.bench import gpt as bench

    tiny = ["--layers", "1", "--heads", "2", "--width", "8", "--context", "8", "--batch", "2",
            "--steps", "1", "--warmup", "0"]
    assert bench.main([*tiny, "--memory", "--json", str(tmp_path / "n1.json")]) == 0
    run = json.loads((tmp_path / "n1.json").read_text())
    assert set(run["modes"]) == {"compute", "serial", "overlap"}
    assert run["efficiency"] is None  # one rank: nothing to hide, no ratio of noise
    assert [b["names"][-2:] for b in run["layout"]][-1] == ["wte", "wpe"]
    doc = tmp_path / "gpt.md"
    doc.write_text(f"head\n{bench.MARK[0]}\nold\n{bench.MARK[1]}\ntail\n")
    assert bench.main(["--report", str(tmp_path), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and "| 1 rank(s), one host | overlap |" in text
    assert text.startswith("head\n") and text.endswith("tail\n") and "| 2 | " in text


# ---------------------------------------------------------------- float32 under Adam

ADAM32 = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-30}  # eps below any rounding noise


def float32_adam(comm=None) -> dict:
    """Two epochs of the GPT in float32 under Adam, on `comm` (None: one process)."""
    from mpidp.training import Adam

    x, y = corpus()
    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    model = GPT(**CONFIG, dtype="float32", seed=rank)
    opt = Adam(model.params, model.grads, **ADAM32)
    sampler = ShardSampler(N_SEQ, GLOBAL_BATCH, rank, size, seed=7)
    if comm is None:
        for epoch in range(EPOCHS):
            for idx in sampler.global_batches(epoch):
                _, dlogits = model.loss(x[idx], y[idx])
                model.backward(dlogits)
                opt.step()
        return model.params
    with DataParallel(model, comm, optimizer=opt) as ddp:
        for epoch in range(EPOCHS):
            for (idx,) in sampler.epoch(epoch):
                _, dlogits = token_cross_entropy(ddp.forward(x[idx]), y[idx])
                ddp.backward(dlogits)
                ddp.step()
        return {k: p.copy() for k, p in model.params.items()}


@pytest.mark.mpi(ranks=[2], timeout=240)
def test_float32_adam_on_n_ranks_equals_one_rank_and_keeps_the_key_bias_at_zero(mpi_ranks):
    """Adam divides by the root of the squared gradients: a gradient of rounding noise (the
    key bias, if it were not written as exactly 0) becomes steps of about lr, different on
    N ranks and on one. Here the key bias stays exactly 0 and N = 2 equals one rank within
    float32's rounding."""
    expected = float32_adam()
    C = CONFIG["width"]

    def check(comm):
        params = float32_adam(comm)
        for name in expected:
            np.testing.assert_allclose(params[name], expected[name], rtol=2e-3, atol=2e-5,
                                       err_msg=f"N={comm.Get_size()} {name}")
        for blk in range(1, CONFIG["n_layer"] + 1):
            assert not params[f"h{blk}.attn_b"][C:2 * C].any()

    on_each_size((2,), check)
