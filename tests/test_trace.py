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
