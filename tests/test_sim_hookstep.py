"""sim step --comm-hook (mpidp/sim/hookstep.py): a hook's bytes and time in the cost model,
the rate below which it pays, the flags. One process; the bytes the model claims are the
ones tests/test_hooks.py counts on the wire (the same formulas, asserted there against
this module's numbers too)."""

from __future__ import annotations

import json

import pytest
from test_sim_step import step

from mpidp.sim import hookstep
from mpidp.sim.profile import measure, write
from mpidp.sim.step import Net, choose
from mpidp.training import MLP
from mpidp.training.buckets import make_buckets
from mpidp.training.powersgd import PowerSGD

G = 4 * 1200  # a bucket of 1200 float32 items: every N below divides it


@pytest.mark.parametrize("N", [2, 3, 5, 6])
def test_fp16_sends_half_the_rings_bytes_and_costs_two_rounds(N):
    net, cache = Net(), {}
    ring = choose("allreduce", "ring", G, N, 0, net, cache)
    c = hookstep.compressed16(G, N, 1, net, 0.0)  # one rank a host: every message crosses
    assert c.sent == ring.sent / 2 == G * (N - 1) / N
    assert c.link == c.sent  # one rank a host: all it sends crosses its link
    assert c.fixed == pytest.approx(2 * (N - 1) * net.alpha_link + G * (N - 1) / N * net.gamma)
    on_one_host = hookstep.compressed16(G, N, 0, net, 0.0)
    assert on_one_host.link == 0 and on_one_host.fixed < c.fixed
    assert hookstep.compressed16(G, N, 1, net, 1e-3).fixed == pytest.approx(c.fixed + 2e-3)


def test_powersgd_all_reduces_m_plus_n_times_r_and_the_small_tensors():
    m = MLP([12, 6, 6], dtype="float32")
    buckets = make_buckets(m, 1 << 20, 1 << 20)  # one bucket: W2, b2, W1, b1
    items = hookstep.factored(PowerSGD(1, min_size=36), m, buckets[0].names)
    assert items == ((6 + 12) * 1 + 6 + 6, (6 + 6) * 1)  # P: m·r each and b1, b2; Q: n·r each
    w2_whole = hookstep.factored(PowerSGD(1, min_size=37), m, buckets[0].names)
    assert w2_whole == (12 + 36 + 6 + 6, 6)
    net, cache = Net(), {}
    c = hookstep.powersgd(items, 4, "ring", 3, 0, net, cache, 0.0)
    assert c.sent == sum(choose("allreduce", "ring", 4 * k, 3, 0, net, cache).sent for k in items)


def test_the_crossover_is_where_the_two_steps_meet():
    # hook: 2 ms + 1 MB at the rate; none: 1 ms + 4 MB: equal at 3 MB / 1 ms = 24 Gbit/s
    def steps(rate):
        per_mb = 8e-3 / rate  # seconds for a MB at `rate` Gbit/s
        return 2e-3 + per_mb, 1e-3 + 4 * per_mb

    said = hookstep.crossover(steps)
    assert said.startswith("pays below ") and float(said.split()[2]) == pytest.approx(24, rel=1e-3)
    assert "every rate" in hookstep.crossover(lambda rate: (1.0, 2.0))
    assert "does not pay" in hookstep.crossover(lambda rate: (2.0, 1.0))


def test_local_work_is_measured_on_the_models_buckets():
    m = MLP([12, 6, 6], dtype="float32")
    buckets = make_buckets(m, 0, 0)  # a bucket per layer
    local = hookstep.measure(m, buckets, ["none", "bf16", "powersgd:2"], repeats=1)
    assert local["none"] == [0.0, 0.0]
    assert all(len(v) == 2 and all(t > 0 for t in v) for k, v in local.items() if k != "none")


@pytest.mark.parametrize("argv,says", [
    (["--comm-hook", "fp8"], "--comm-hook: 'fp8'"),
    (["--comm-hook", "none,powersgd:0"], "'powersgd:0'"),
    (["--comm-hook", "fp16", "--zero", "1"], "--comm-hook with --zero"),
    (["--comm-hook", "bf16", "--dtype", "float64"], "not float64")])
def test_a_bad_hook_is_one_line_and_exit_code_2(argv, says, capsys):
    code, out, err = step(argv, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("profile") / "mlp.json")
    write(path, measure("mlp", [64, 128, 64, 10], 16, repeats=1))
    return path


def test_a_row_per_hook_and_the_rate_each_pays_below(mlp_profile, tmp_path, capsys):
    path = str(tmp_path / "step.json")
    code, out, _ = step(["--profile", mlp_profile, "--ranks", "2,3", "--rate", "0.1",
                         "--comm-hook", "none,fp16,powersgd:2", "--json", path], capsys)
    assert code == 0, out
    rows = json.load(open(path))["rows"]
    assert [(r["N"], r["hook"]) for r in rows] == [
        (N, h) for N in (2, 3) for h in ("none", "fp16", "powersgd:2")]
    for N in (2, 3):
        by = {r["hook"]: r for r in rows if r["N"] == N}
        assert by["fp16"]["rank_bytes"] == pytest.approx(by["none"]["rank_bytes"] / 2)
        assert by["powersgd:2"]["rank_bytes"] < by["fp16"]["rank_bytes"]
        for hook in ("fp16", "powersgd:2"):
            assert f"{hook} on {N} ranks: pays below " in out
            assert by[hook]["step_s"] < by["none"]["step_s"]  # at 0.1 Gbit/s both pay
    assert "| 2 | 2 × 1 | fp16 | direct16 |" in out
