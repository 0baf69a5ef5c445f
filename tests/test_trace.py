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
    ddp = DataParallel(model, comm, bucket_mb=0, tracer=tracer)
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
