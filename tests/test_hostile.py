"""Hostile files around a trainer: planted links, FIFOs where a file should be, cut-off rows,
a disk that fills up, and mutated checkpoints.

Each test plants what an adversary (or bad luck) would leave in the folder a run writes
to, and asserts the run refuses it in one line or works around it, never destroying
another file and never ending in a traceback. The trainers run in this process, on one
rank (as in test_outputs.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat

import numpy as np
import pytest

from mpidp import files
from mpidp.trace import Tracer
from mpidp.training import MLP, SGD, checkpoint, softmax_cross_entropy
from mpidp.training.checkpoint import CheckpointError

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--global-batch", "960", "--hidden", "8", "--progress", "never", "--data", "synthetic"]


def _module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "..", "examples",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(argv, capsys, name="train_mlp", small=SMALL) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a trainer's main in this process."""
    capsys.readouterr()
    try:
        code = _module(name).main([*small, *map(str, argv)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def trained(steps=2):
    model = MLP([6, 5, 3], dtype="float64", seed=1)
    opt = SGD(model.params, model.grads, lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x, y = rng.standard_normal((4, 6)), rng.integers(0, 3, 4)
        model.backward(softmax_cross_entropy(model.forward(x), y)[1])
        opt.step()
    return model, opt


# ---------------------------------------------------------------- links and non-regular files


def test_a_link_planted_at_the_old_temporary_name_is_never_followed(tmp_path):
    """Before: save wrote `.NAME.tmp<pid>` with open(), through a link planted there, so the
    link's target (any file the user can write) was overwritten, and the link then renamed
    over the checkpoint."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    ck = tmp_path / "ck.npz"
    os.symlink(victim, tmp_path / f".ck.npz.tmp{os.getpid()}")
    model, opt = trained()
    checkpoint.save(str(ck), model, opt, {"epoch": 1})
    assert victim.read_text() == "precious"
    assert not os.path.islink(ck) and stat.S_ISREG(os.lstat(ck).st_mode)
    assert checkpoint.load(str(ck), *trained(0)) == {"epoch": 1}


def test_save_refuses_a_fifo_and_leaves_it_a_fifo(tmp_path):
    """Before: the temporary file was renamed over the FIFO (a device node as root)."""
    fifo = tmp_path / "ck.npz"
    os.mkfifo(fifo)
    with pytest.raises(files.WriteError, match="not a regular file"):
        checkpoint.save(str(fifo), *trained(), {"epoch": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["ck.npz"]


@pytest.mark.parametrize("flag", ["--checkpoint", "--trace", "--metrics"])
def test_an_output_that_is_a_fifo_is_refused_before_any_training(flag, tmp_path, capsys):
    """`--checkpoint <a device> --overwrite` replaced the device node after the first epoch
    (a FIFO stands in for the device: the same check refuses both); a --trace FIFO blocked
    the end of the run forever; a --metrics FIFO blocked the first row."""
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    code, out, err = train(["--epochs", 1, flag, fifo, "--overwrite"], capsys)
    assert code == 2, (code, out, err)
    assert err.startswith(f"train_mlp.py: error: {flag} ") and len(err.splitlines()) == 1, err
    assert "not a regular file" in err and out == ""
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ---------------------------------------------------------------- data loss


def test_a_trace_that_fails_midway_leaves_the_old_trace(tmp_path, monkeypatch):
    """Before: the trace was opened with "w" (the old one gone at once), so a full disk left
    broken JSON where a valid trace had been."""
    path = tmp_path / "trace.json"
    tracer = Tracer(0)
    tracer.add("old", 0.0, 1.0, "compute")
    tracer.write(str(path))
    old = path.read_text()
    dump = json.dump

    def full_disk(obj, f, **kw):
        f.write('{"traceEvents": [')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk)
    tracer.add("new", 1.0, 2.0, "compute")
    with pytest.raises(OSError, match="No space"):
        tracer.write(str(path))
    monkeypatch.setattr(json, "dump", dump)
    assert path.read_text() == old and json.loads(old)["traceEvents"]
    assert os.listdir(tmp_path) == ["trace.json"]


def test_resume_after_a_cut_off_metrics_row_starts_a_fresh_line(tmp_path, capsys):
    """A run killed mid-row left `{"epoch": 2, "lo`; before, the resumed run's row was glued
    onto it (one unreadable line, the new row lost to a JSON reader)."""
    ck, metrics = tmp_path / "ck.npz", tmp_path / "m.jsonl"
    assert train(["--epochs", 1, "--checkpoint", ck, "--metrics", metrics], capsys)[0] == 0
    with open(metrics, "a") as f:
        f.write('{"epoch": 2, "lo')  # what a kill mid-write leaves
    code, out, err = train(["--epochs", 2, "--checkpoint", ck, "--resume", "--metrics", metrics],
                           capsys)
    assert code == 0, err
    lines = metrics.read_text().splitlines()
    assert len(lines) == 3 and lines[1] == '{"epoch": 2, "lo', lines
    assert json.loads(lines[0])["epoch"] == 1 and json.loads(lines[2])["epoch"] == 2


def test_metrics_through_a_symlink_write_its_target_and_keep_the_link(tmp_path, capsys):
    target, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    os.symlink("real.jsonl", link)
    ck = tmp_path / "ck.npz"
    assert train(["--epochs", 1, "--metrics", link, "--checkpoint", ck], capsys)[0] == 0
    code, _, err = train(["--epochs", 2, "--metrics", link, "--checkpoint", ck, "--resume"],
                         capsys)
    assert code == 0, err
    assert os.path.islink(link)
    assert [json.loads(r)["epoch"] for r in target.read_text().splitlines()] == [1, 2]
