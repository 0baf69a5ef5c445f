"""sim step: schedules by symmetry equal the full simulation's; the step's parts; its flags.

All in one process (no MPI launch): the schedules are the simulator's own.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from mpidp.collectives.placement import layout
from mpidp.sim import stepcli, zero3step
from mpidp.sim import symmetry as sym
from mpidp.sim.collective import simulate
from mpidp.sim.predict import Network, Timer
from mpidp.sim.profile import measure, read, write
from mpidp.sim.step import Cost, Net, Reduction, cost, predict, share
from mpidp.sim.volume import measure as volume_measure
from mpidp.untrusted import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = [("allreduce", "ring", 7, 0), ("allreduce", "ring", 12, 4), ("allreduce", "ring", 8, 1),
         ("allreduce", "rabenseifner", 16, 0), ("allreduce", "rabenseifner", 32, 4),
         ("allreduce", "recursive_doubling", 8, 2), ("allreduce", "hierarchical", 24, 8),
         ("allreduce", "hierarchical", 6, 2), ("allreduce", "direct", 9, 3),
         ("reduce_scatter", "ring", 6, 2), ("reduce_scatter", "recursive_halving", 16, 4),
         ("allgather", "ring", 5, 0), ("allgather", "recursive_doubling", 8, 2),
         ("allreduce", "rabenseifner", 256, 8)]


@pytest.mark.parametrize("collective,algorithm,N,ppn", CASES)
def test_symmetry_equals_the_full_simulation(collective, algorithm, N, ppn):
    whole = sym.full(collective, algorithm, N, ppn)
    alone = sym.by_symmetry(collective, algorithm, N, ppn)
    assert alone._replace(how="full") == whole
    assert len(whole.steps) == simulate(collective, algorithm, N, whole.count,
                                        placement=layout(N, ppn=ppn) if ppn else None,
                                        data=False).sim.steps  # lock-step: a round a step


def test_no_symmetry_is_claimed_where_there_is_none():
    assert not sym.symmetric("allreduce", "rabenseifner", 12)  # folded ranks differ
    assert not sym.symmetric("allreduce", "ring", 10, 4)  # unequal hosts
    assert not sym.symmetric("allreduce", "naive", 8)
    with pytest.raises(ValueError, match="no symmetry"):
        sym.by_symmetry("allreduce", "naive", 8)
    assert sym.schedule("allreduce", "naive", 8).how == "full"


@pytest.mark.parametrize("algorithm,N,ppn", [("ring", 6, 0), ("ring", 8, 2),
                                             ("rabenseifner", 8, 0), ("rabenseifner", 16, 4),
                                             ("hierarchical", 12, 4), ("direct", 5, 0)])
def test_a_bucket_alone_takes_the_simulators_time(algorithm, N, ppn):
    """One reduction, nothing else in flight: its time is `mpidp.sim.predict`'s Timer's
    (on one level exactly; across hosts to 0.2%: the Timer lets a step's messages start
    as their own ports and links free up, the step here waits for its busiest one)."""
    net = Net(alpha=7e-6, beta=3e-10, gamma=2e-10, alpha_link=25e-6, beta_link=8e-10)
    count = sym.sim_items("allreduce", algorithm, N)
    network = Network(net.alpha, net.beta, net.gamma, 0.0, ppn, net.alpha_link, net.beta_link)
    timer = Timer(N, network, 1.0, sym.ITEM)
    simulate("allreduce", algorithm, N, count, dtype="float32", timer=timer,
             placement=layout(N, ppn=ppn) if ppn else None, data=False)
    got = cost("allreduce", algorithm, count * sym.ITEM, N, ppn, net, {})
    assert got.fixed + got.wire == pytest.approx(timer.seconds, rel=2e-3 if ppn else 1e-9)


def test_the_link_is_shared_by_the_reductions_in_flight():
    def c(fixed, wire):
        return Cost(fixed, wire, np.zeros(0), 0.0, 0.0, "x")

    assert share([0.0, 0.0], [c(0, 1), c(0, 1)])[0] == [2.0, 2.0]  # half the rate each
    assert share([0.0, 5.0], [c(0, 1), c(0, 1)])[0] == [1.0, 6.0]  # one after the other
    assert share([0.0, 0.0], [c(1, 0), c(1, 0)])[0] == [1.0, 1.0]  # α is not shared
    ends = share([0.0, 1.0], [c(1, 1), c(0, 1)])[0]  # 0.5 done at 1; then 1 + 0.5 * 3
    assert ends == pytest.approx([2.5, 2.75])


UNITS = [(1, 1e-3, 2e-3), (2, 1e-3, 2e-3), (3, 1e-3, 2e-3)]


def test_without_overlap_all_communication_is_exposed():
    net, N = Net(), 8
    reds = [Reduction("b0", 3, 1.0, 1 << 20), Reduction("b1", 1, 1.0, 1 << 20)]
    out = predict(UNITS, reds, 1e-3, N, 0, net, "ring", overlap=False)
    alone = share([0.0, 0.0], [cost("allreduce", "ring", 1 << 20, N, 0, net, {})] * 2)[0]
    assert out["compute_s"] == pytest.approx(3e-3 + 6e-3 + 1e-3)
    assert out["step_s"] == pytest.approx(out["compute_s"] + max(alone))
    assert out["hidden"] == pytest.approx(0.0)


def test_overlap_hides_what_backward_covers():
    net, N = Net(), 4
    small = cost("allreduce", "ring", 1 << 10, N, 0, net, {})
    assert small.fixed + small.wire < 2e-3  # shorter than the backward after it
    reds = [Reduction("b0", 3, 1.0, 1 << 10), Reduction("b1", 1, 1.0, 1 << 10)]
    on = predict(UNITS, reds, 0.0, N, 0, net, "ring")
    off = predict(UNITS, reds, 0.0, N, 0, net, "ring", overlap=False)
    assert on["step_s"] < off["step_s"]
    # bucket 0 hides whole under units 2 and 1's backward; bucket 1 starts at the end
    assert on["exposed_s"] == pytest.approx(small.fixed + small.wire)
    assert on["link_bytes"] == 0 and on["rank_bytes"] == pytest.approx(2 * small.sent)


# stage 3: units 1..3 each in a bucket of its own, last first (bucket 0 is unit 3)
NEEDS, COMPLETES = {1: [2], 2: [1], 3: [0]}, {3: 0, 2: 1, 1: 2}


def test_zero3_sends_three_gathers_worth_and_two_more_per_micro_batch():
    """(2A + 1)·G·(N-1)/N bytes a rank (zero3.py's cost line): 2A all-gathers, one
    reduce-scatter, each moving G·(N-1)/N with the ring."""
    N, G = 4, 3 << 20
    for A in (1, 3):
        out = zero3step.predict(UNITS, NEEDS, COMPLETES, [G // 3] * 3, 1e-3, N, 0, Net(),
                                "ring", accum=A)
        assert out["rank_bytes"] == pytest.approx((2 * A + 1) * G * (N - 1) / N)
        assert out["compute_s"] == pytest.approx(A * 9e-3 + 1e-3 / N)


def test_zero3_waits_for_every_gather_and_prefetch_hides_all_but_the_first_ones():
    N, net, nbytes = 4, Net(), [1 << 10] * 3
    ag = cost("allgather", "ring", 1 << 10, N, 0, net, {})
    rs = cost("reduce_scatter", "ring", 1 << 10, N, 0, net, {})
    t_ag, t_rs = ag.fixed + ag.wire, rs.fixed + rs.wire
    assert t_ag < 1e-3 and t_rs < 1e-3  # each shorter than any unit's compute
    off = zero3step.predict(UNITS, NEEDS, COMPLETES, nbytes, 0.0, N, 0, net, "ring")
    on = zero3step.predict(UNITS, NEEDS, COMPLETES, nbytes, 0.0, N, 0, net, "ring",
                           prefetch=True)
    # without prefetch: all 6 gathers in line with compute, then the last reduce-scatter;
    # backward's gathers of units 2 and 1 wait for the link behind the reduce-scatter
    # just started (its bytes, not its α: one collective on the link at a time)
    assert off["exposed_s"] == pytest.approx(6 * t_ag + t_rs + 2 * rs.wire)
    # with it: the first unit's gather of forward, and of backward (unit 3, freed after
    # forward), then the last reduce-scatter; the others run under compute
    assert on["exposed_s"] == pytest.approx(2 * t_ag + t_rs)
    assert on["communication_s"] == off["communication_s"] == pytest.approx(6 * t_ag + 3 * t_rs)


def test_zero3_on_a_link_that_is_the_limit_prefetch_hides_only_latency():
    """No compute: the bytes wait in line for the link with or without prefetch; what
    prefetch hides is the gathers' α and γ parts (their own, run beside other bytes)."""
    still = [(1, 0.0, 0.0), (2, 0.0, 0.0), (3, 0.0, 0.0)]
    args = (still, NEEDS, COMPLETES, [1 << 20] * 3, 0.0, 4, 2, Net(), "ring")
    off, on = zero3step.predict(*args), zero3step.predict(*args, prefetch=True)
    ag = cost("allgather", "ring", 1 << 20, 4, 2, Net(), {})
    rs = cost("reduce_scatter", "ring", 1 << 20, 4, 2, Net(), {})
    assert on["step_s"] >= 6 * ag.wire + 3 * rs.wire  # the bytes, one after the other
    assert 0 < off["step_s"] - on["step_s"] <= 6 * ag.fixed + 1e-12


def test_one_rank_has_nothing_to_communicate():
    out = predict(UNITS, [Reduction("b0", 1, 1.0, 1 << 20)], 1e-3, 1, 0, Net(), "ring")
    assert out["step_s"] == pytest.approx(out["compute_s"]) and out["exposed_s"] == 0


def test_volume_by_symmetry_equals_the_whole_run():
    for algorithm, N, ppn in [("ring", 12, 4), ("rabenseifner", 64, 8), ("hierarchical", 16, 4),
                              ("direct", 6, 0)]:
        where = layout(N, ppn=ppn) if ppn else None
        assert volume_measure("allreduce", algorithm, N, where, symmetry=True) == \
            volume_measure("allreduce", algorithm, N, where, symmetry=False)


# ---------------------------------------------------------------- profile and flags

@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("profile") / "mlp.json")
    write(path, measure("mlp", [64, 128, 64, 10], 16, repeats=1))
    return path


def test_a_profile_is_read_back_checked(mlp_profile, tmp_path):
    got = read(mlp_profile)
    assert [u["unit"] for u in got["units"]] == [1, 2, 3]
    assert [u["grad_bytes"] for u in got["units"]] == [4 * (64 * 128 + 128),
                                                       4 * (128 * 64 + 64), 4 * (64 * 10 + 10)]
    data = json.load(open(mlp_profile))
    for broken in ({**data, "kind": "other"}, {**data, "units": []},
                   {**data, "update_s": -1}, {**data, "model": "cnn"}):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(broken))
        with pytest.raises(InputError, match="bad.json"):
            read(str(bad))


def step(argv, capsys):
    code = stepcli.main(["step", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,says", [
    (["--prefetch"], "--prefetch"), (["--ranks", "6", "--ppn", "4"], "--ppn 4"),
    (["--rate", "0"], "--rate"), (["--ranks", "0"], "--ranks"),
    (["--zero", "1", "--algorithm", "direct"], "--algorithm"),
    (["--ranks", "128"], "--global-batch 64"), (["--model", "gpt", "--width", "10"], "--width"),
    (["--profile", "/nonexistent/p.json"], "p.json"), (["--draw", "/tmp/x.txt"], "--draw"),
    (["--json", "/nonexistent/s.json"], "--json")])
def test_a_bad_flag_is_one_line_and_exit_code_2(argv, says, capsys):
    code, out, err = step(argv, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err


def test_a_profile_of_another_model_is_refused(mlp_profile, capsys):
    code, _, err = step(["--hidden", "32", "--profile", mlp_profile], capsys)
    assert code == 2 and "measured for mlp [64, 128, 64, 10]" in err


def test_step_prints_a_table_and_writes_json(mlp_profile, tmp_path, capsys):
    path = str(tmp_path / "step.json")
    code, out, _ = step(["--profile", mlp_profile, "--ranks", "2,4", "--json", path], capsys)
    assert code == 0 and [line.split(" | ")[0] for line in out.splitlines()
                          if line[2:3].isdigit()] == ["| 2", "| 4"]
    rows = json.load(open(path))["rows"]
    assert [r["N"] for r in rows] == [2, 4]
    assert all(r["step_s"] >= r["compute_s"] > 0 and 0 <= r["hidden"] <= 1 for r in rows)


def test_step_predicts_zero3_with_the_models_own_buckets(mlp_profile, tmp_path, capsys):
    """--zero 3 on the trainer's MLP: one bucket per layer, 3·G·(N-1)/N bytes a rank."""
    G = 4 * (64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10)
    rows = {}
    for flags in ([], ["--prefetch"]):
        path = str(tmp_path / f"z3{len(flags)}.json")
        code, _, _ = step(["--profile", mlp_profile, "--hidden", "128,64", "--zero", "3",
                           "--ranks", "3", "--rate", "1", *flags, "--json", path], capsys)
        assert code == 0
        rows[bool(flags)] = json.load(open(path))["rows"][0]
    for r in rows.values():
        assert r["rank_bytes"] == pytest.approx(3 * G * 2 / 3) and r["reductions"] == 3
    assert rows[True]["step_s"] <= rows[False]["step_s"]


def _trainer(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_args([])


def test_the_model_flags_default_as_the_trainers_do():
    mlp, gpt = _trainer("train_mlp"), _trainer("train_gpt")
    ours = stepcli.parser().parse_args([])
    for name in ("hidden", "activation", "data", "dtype", "zero", "algorithm", "piece_mb",
                 "first_bucket_mb", "accum_steps"):
        assert getattr(ours, name) == getattr(mlp, name), name
    for name in ("layers", "heads", "width", "context"):
        assert getattr(ours, name) == getattr(gpt, name), name
    for model, trainer in (("mlp", mlp), ("gpt", gpt)):
        for name, value in stepcli.DEFAULTS[model].items():
            assert getattr(trainer, name) == value, (model, name)
