"""Timelines: Chrome trace JSON with a row per rank, and the PNG drawn from it."""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from mpidp import trace
from mpidp.training import MLP, DataParallel, softmax_cross_entropy


def test_tracer_writes_chrome_trace_events(tmp_path):
    t = trace.Tracer(rank=0)
    with t.span("forward L1", "forward"):
        pass
    t.add("allreduce bucket 0", t.t0 + 0.001, t.t0 + 0.003, "allreduce", tid=1, bytes=8)
    t.name_row(1, "bucket 0")
    path = str(tmp_path / "t.json")
    t.write(path)
    events = json.load(open(path))["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["forward L1", "allreduce bucket 0"]
    assert spans[1]["ts"] == pytest.approx(1000) and spans[1]["dur"] == pytest.approx(2000)
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} == {
        "compute", "bucket 0"}


@pytest.mark.mpi(ranks=[2], timeout=90)
def test_trace_of_a_training_step_has_every_rank_layer_and_bucket(mpi_ranks, shared_dir):
    comm = MPI.COMM_WORLD
    folder = shared_dir
    tracer = trace.Tracer(comm.Get_rank())
    model = MLP([8, 6, 5, 3], dtype="float64", seed=0)
    ddp = DataParallel(model, comm, bucket_mb=0)
    tracer.follow(ddp)
    x, y = np.random.default_rng(0).standard_normal((4, 8)), np.array([0, 1, 2, 0])
    for _ in range(2):
        ddp.backward(softmax_cross_entropy(ddp.forward(x), y)[1])
    path = os.path.join(folder, "trace.json")
    tracer.write(path, comm)
    if comm.Get_rank() == 0:
        events = json.load(open(path))["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        assert {e["pid"] for e in spans} == {0, 1}
        names = {e["name"] for e in spans}
        assert {"forward L1", "forward L3", "backward L3", "backward L1", "wait"} <= names
        assert {f"allreduce bucket {k}" for k in range(3)} <= names
        for e in spans:
            assert e["dur"] >= 0
        # each bucket's rounds, marked on its row at the hooks where they were posted
        rounds = {(e["pid"], e["tid"]) for e in events
                  if e["ph"] == "i" and e["cat"] == "round" and e["name"].startswith("round ")}
        assert rounds == {(p, trace.COMM + k) for p in (0, 1) for k in range(3)}, rounds
        png = os.path.join(folder, "timeline.png")
        assert trace.main(["plot", path, "-o", png]) == 0
        assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_demo_trace_shows_each_layers_allreduce_start_during_backward(tmp_path):
    """`make demo`'s flags (read from the Makefile): one bucket per layer, each launched
    while backward still runs, and the demo's last line names the trace file."""
    import re
    import sys

    from test_failures import ROOT, mpiexec

    recipe = open(os.path.join(ROOT, "Makefile")).read().split("\ndemo:")[1].split("\n\n")[0]
    flags = re.search(r"examples/train_mlp\.py(.*)", recipe).group(1).split()
    assert "--bucket-mb" in flags and "--trace" in flags, recipe
    path = str(tmp_path / "demo.json")
    flags[flags.index("--trace") + 1] = path
    code, out, err, _ = mpiexec(2, [sys.executable, os.path.join(ROOT, "examples",
                                                                   "train_mlp.py"),
                                    *flags, "--epochs", "1", "--progress", "never"])
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith(f"trace: {path} "), out
    spans = [e for e in json.load(open(path))["traceEvents"]
             if e["ph"] == "X" and e["pid"] == 0]
    waits = [e["ts"] for e in spans if e["name"] == "wait"]
    layers = sorted({int(e["name"].split("L")[1]) for e in spans
                     if e["name"].startswith("backward L")})
    assert len(layers) >= 3 and waits, "a multi-layer model, synced steps"
    steps = 0
    for w in waits:  # one synced step: its backward spans and all-reduces end at its wait
        bwd = {int(e["name"].split("L")[1]): e for e in spans
               if e["name"].startswith("backward L") and w - 50_000 < e["ts"] <= w}
        if set(bwd) != set(layers):
            continue  # the trace's first wait without a whole step before it
        starts = sorted(e["ts"] for e in spans if e["name"].startswith("allreduce bucket")
                        and bwd[layers[-1]]["ts"] <= e["ts"] <= w)
        assert len(starts) == len(layers), (w, starts)  # one bucket per layer
        # every bucket but the first layer's starts before backward reaches layer 1
        assert sum(t < bwd[1]["ts"] for t in starts) == len(layers) - 1, (w, starts)
        steps += 1
    assert steps > 0


def three_steps(path):
    """A trace of 2 ranks, 3 steps each (forward, backward, wait, optimizer), 10 ms apart."""
    events = []
    for rank in (0, 1):
        t = trace.Tracer(rank)
        t.t0 = 0.0
        for k in range(3):
            s = 0.010 * k + 0.001 * rank
            t.add("forward L1", s, s + 0.002, "forward")
            t.add("backward L1", s + 0.002, s + 0.004, "backward")
            t.add("allreduce bucket 0", s + 0.003, s + 0.008, "allreduce", tid=trace.COMM)
            t.add("wait", s + 0.004, s + 0.008, "wait")
            t.add("sgd", s + 0.008, s + 0.009, "optimizer")
        events += t.chrome_events()
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)


def test_the_timeline_keys_the_kinds_it_draws_off_the_bars(tmp_path, monkeypatch):
    from helpers.plots import drawn, problems

    path = str(tmp_path / "run.json")
    three_steps(path)
    figures = drawn(monkeypatch)
    trace.plot(path, str(tmp_path / "t.png"))
    (fig,) = figures
    assert problems(fig) == []  # reduce_scatter is not in the key: there is none to draw


def test_plot_draws_one_step_by_default_and_says_how_to_draw_others(tmp_path, capsys):
    path, png = str(tmp_path / "run.json"), str(tmp_path / "t.png")
    three_steps(path)
    events = trace.load(path)

    def ms(pairs):
        return [tuple(round(t, 6) for t in pair) for pair in pairs]

    assert ms(trace.steps(events)) == [(0, 9), (9, 19), (19, 29)]  # rank 0's, in ms
    lo, hi, what = trace.window(events)
    assert ms([(lo, hi)]) == [(9, 20)] and what == "step 2 of 3"  # the middle one, each
    # rank's own: rank 0's from 9 to 19 ms, rank 1's (1 ms behind) from 10 to 20
    assert ms([trace.window(events, step=1)[:2]]) == [(0, 10)]
    assert ms([trace.window(events, whole=True)[:2]]) == [(0, 30)]
    assert ms([trace.window(events, end_ms=12)[:2]]) == [(9, 12)]
    assert trace.main(["plot", path, "-o", png]) == 0
    out = capsys.readouterr().out
    assert "step 2 of 3" in out and "--step K" in out and "--all" in out, out
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,message", [
    (["bad.json"], "bad.json: not a readable trace"),
    (["run.json", "--step", "4"], "--step 4: the trace has 3 steps"),
    (["run.json", "--start", "20", "--end", "10"], "an empty window"),
])
def test_plot_of_a_bad_file_or_window_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    three_steps(str(tmp_path / "run.json"))
    (tmp_path / "bad.json").write_text("{")
    png = tmp_path / "t.png"
    assert trace.main(["plot", *(str(tmp_path / a) if a.endswith(".json") else a
                                 for a in args), "-o", str(png)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert err.startswith("python -m mpidp.trace plot: error: ") and not png.exists()


def test_plot_of_a_missing_file_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mpidp.trace", "plot", "missing.json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "python -m mpidp.trace plot: error: missing.json: no such file\n"


@pytest.mark.parametrize("output, message", [
    ("none/t.png", "no such folder"),
    ("fifo.png", "not a regular file"),
    ("t.txt", "'txt' is not a format"),
])
def test_plot_to_a_place_it_cannot_write_is_one_line_and_exit_2(tmp_path, capsys, output,
                                                                message):
    """Before: a missing folder or a .txt name ended in a traceback after the drawing, and
    a FIFO blocked forever; an old image is replaced whole (mpidp.files) or kept."""
    three_steps(str(tmp_path / "run.json"))
    os.mkfifo(tmp_path / "fifo.png")
    assert trace.main(["plot", str(tmp_path / "run.json"), "-o", str(tmp_path / output)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert err.startswith("python -m mpidp.trace plot: error: ")
    assert sorted(os.listdir(tmp_path)) == ["fifo.png", "run.json"]


def out_of_phase(path):
    """2 ranks, 3 steps of 10 ms each, rank 1 half a step behind rank 0; span names say
    the step ("forward L1 s2"), a piece's tick and a round's tick on the bucket row."""
    events = []
    for rank in (0, 1):
        t = trace.Tracer(rank)
        t.t0 = 0.0
        for k in range(3):
            s, name = 0.010 * k + 0.005 * rank, f"s{k + 1}"
            t.add(f"forward L1 {name}", s, s + 0.002, "forward")
            t.add(f"backward L1 {name}", s + 0.002, s + 0.006, "backward")
            t.add(f"allreduce bucket 0 {name}", s + 0.004, s + 0.008, "allreduce",
                  tid=trace.COMM)
            t.mark(f"round 0 {name}", s + 0.004, "round", tid=trace.COMM)
            t.mark(f"piece 0 done {name}", s + 0.005, "allreduce", tid=trace.COMM)
            t.add(f"sgd {name}", s + 0.008, s + 0.010, "optimizer")
        events += t.chrome_events()
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)


def test_the_default_window_is_the_same_step_on_every_rank_and_its_ticks_are_keyed(
        tmp_path, monkeypatch):
    """Ranks out of phase: the middle step of each rank, not rank 0's interval (which
    would show the end of rank 1's step 1 and the start of its step 3); the ticks (a round
    posted, a piece done) are in the key."""
    from helpers.plots import drawn, problems

    path = str(tmp_path / "run.json")
    out_of_phase(path)
    events = trace.load(path)
    lo, hi, what, bounds = trace.windows(events)
    assert what == "step 2 of 3" and (round(lo, 6), round(hi, 6)) == (10, 25)
    spans = trace.spans_in(events, lo, hi, bounds)
    assert spans and {e["name"].rsplit(" ", 1)[1] for e in spans} == {"s2"}, spans
    assert {e["pid"] for e in spans} == {0, 1}
    figures = drawn(monkeypatch)
    trace.plot(path, str(tmp_path / "t.png"))
    (fig,) = figures
    assert problems(fig) == []
    keys = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "round posted" in keys and "piece done" in keys, keys


def test_plot_of_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    """A trace that is a FIFO: before, `open` blocked until a writer came (for ever); the one
    reader (mpidp.untrusted) refuses it."""
    os.mkfifo(tmp_path / "run.json")
    assert trace.main(["plot", str(tmp_path / "run.json"), "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "not a regular file" in err, err
