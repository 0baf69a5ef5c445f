"""A trainer's output files: every problem with them found at start, and none of them lost.

The trainer runs here in this process, on one rank (its checks are rank 0's; the
launched, multi-rank side is in test_failures.py). `outputs.check` is the
package's, which every trainer calls; `checkpoint.save` writes through symlinks.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re

import pytest

from mpidp.training import MLP, SGD, checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "train_mlp.py")
SMALL = ["--global-batch", "960", "--hidden", "8", "--progress", "never", "--data", "synthetic"]


def trainer():
    spec = importlib.util.spec_from_file_location("train_mlp", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the trainer's main: its return, or every rank's exit."""
    capsys.readouterr()
    try:
        code = trainer().main([*SMALL, *map(str, argv)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- two flags, one file


def _same(d):
    """Case -> (flags, the file two of them name); d/ck.npz exists."""
    ck = d / "ck.npz"
    os.symlink(ck, d / "link.jsonl")
    os.link(ck, d / "hard.json")
    return {
        "trace and checkpoint": (["--trace", ck, "--checkpoint", ck, "--overwrite"], ck),
        "metrics and checkpoint": (["--metrics", ck, "--checkpoint", ck, "--overwrite"], ck),
        "metrics through a symlink to the checkpoint":
            (["--metrics", d / "link.jsonl", "--checkpoint", ck, "--overwrite"], ck),
        "trace as a hard link of the checkpoint":
            (["--trace", d / "hard.json", "--checkpoint", ck, "--overwrite"], ck),
        "a relative and an absolute path":
            (["--metrics", "ck.npz", "--trace", ck], ck),
        "metrics and trace, neither there yet":
            (["--metrics", d / "run.json", "--trace", "sub/../run.json"], d / "run.json"),
    }


SAME = ["trace and checkpoint", "metrics and checkpoint",
        "metrics through a symlink to the checkpoint", "trace as a hard link of the checkpoint",
        "a relative and an absolute path", "metrics and trace, neither there yet"]


@pytest.mark.parametrize("case", SAME)
def test_two_outputs_naming_one_file_are_refused_before_any_work(case, tmp_path, capsys,
                                                                  monkeypatch):
    """Before: --trace ck.npz --checkpoint ck.npz left the trace where the checkpoint was,
    and --metrics into the checkpoint's path lost every row."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    ck = tmp_path / "ck.npz"
    ck.write_bytes(b"three epochs of work")
    flags, named = _same(tmp_path)[case]
    code, out, err = train(["--epochs", 1, *flags], capsys)
    assert code == 2, (code, out, err)
    assert err.startswith("train_mlp.py: error: ") and len(err.splitlines()) == 1, err
    assert "name the same file" in err and os.path.realpath(named) in err, err
    assert out == "", out  # nothing trained
    assert ck.read_bytes() == b"three epochs of work"
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["ck.npz", "sub", "link.jsonl", "hard.json"]), "a file was written"


def test_distinct_outputs_are_all_written(tmp_path, capsys):
    """The check refuses one file named twice, not three files side by side."""
    files = {f: tmp_path / n for f, n in (("--metrics", "m.jsonl"), ("--trace", "t.json"),
                                          ("--checkpoint", "ck.npz"))}
    code, out, err = train(["--epochs", 1, *[x for kv in files.items() for x in kv]], capsys)
    assert code == 0, err
    assert json.loads(files["--metrics"].read_text())["epoch"] == 1
    assert "traceEvents" in json.loads(files["--trace"].read_text())
    assert int(checkpoint.read(str(files["--checkpoint"]))["state/epoch"]) == 1


# ---------------------------------------------------------------- names too long


def _name_max(folder) -> int:
    return os.pathconf(folder, "PC_NAME_MAX")


def test_a_checkpoint_name_with_no_room_for_its_temporary_file_fails_at_start(tmp_path, capsys):
    """Before: a 252-character name trained a whole epoch, then failed to write its
    temporary file (.NAME.tmpPID) with a traceback."""
    ck = tmp_path / ("c" * 248 + ".npz")  # 252 characters: a valid name
    assert len(ck.name) <= _name_max(tmp_path)
    code, out, err = train(["--epochs", 1, "--checkpoint", ck], capsys)
    assert code == 2, (code, out, err)
    assert err.startswith("train_mlp.py: error: --checkpoint ") and len(err.splitlines()) == 1
    assert "temporary file" in err and "shorter name" in err, err
    assert out == "" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag", ["--metrics", "--trace", "--checkpoint"])
def test_a_name_longer_than_the_file_system_allows_fails_at_start(flag, tmp_path, capsys):
    path = tmp_path / ("m" * (_name_max(tmp_path) + 1))
    code, out, err = train(["--epochs", 1, flag, path], capsys)
    assert code == 2, (code, out, err)
    assert "characters" in err and len(err.splitlines()) == 1, err
    assert out == ""


def _model():
    model = MLP([4, 3, 2], dtype="float64", seed=1)
    return model, SGD(model.params, model.grads, lr=0.1)


def test_the_longest_checkpoint_name_the_check_allows_is_one_save_can_write(tmp_path):
    """The check and `save` agree: its longest allowed name saves, one more character
    does not (the temporary file's name is too long: ENAMETOOLONG)."""
    from mpidp.training import outputs

    def problem(length):
        path = str(tmp_path / ("c" * length))
        return outputs.check({"--checkpoint": path}, checkpoint="--checkpoint")
    longest = max(n for n in range(1, _name_max(tmp_path) + 1) if problem(n) is None)
    assert problem(longest + 1) is not None
    model, opt = _model()
    checkpoint.save(str(tmp_path / ("c" * longest)), model, opt, {"epoch": 1})
    with pytest.raises(OSError) as info:
        checkpoint.save(str(tmp_path / ("c" * (longest + 1))), model, opt, {"epoch": 1})
    assert info.value.errno == errno.ENAMETOOLONG
    assert os.listdir(tmp_path) == ["c" * longest]


# ---------------------------------------------------------------- through a symlink


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_checkpoint_through_a_symlink_replaces_the_target_and_keeps_the_link(
        tmp_path, target_exists):
    """Before: the link became a regular file and its target stayed stale. The target is
    in another folder: the temporary file goes beside the target (a rename is atomic
    only within one file system), not beside the link."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "store").mkdir()
    target, link = tmp_path / "store" / "real.npz", tmp_path / "runs" / "link.npz"
    os.symlink(os.path.join("..", "store", "real.npz"), link)  # relative, as ln -s makes
    model, opt = _model()
    if target_exists:
        checkpoint.save(str(target), model, opt, {"epoch": 1})
    replaced = []
    real_replace = os.replace
    os.replace = lambda src, dst: (replaced.append((src, dst)), real_replace(src, dst))
    try:
        checkpoint.save(str(link), model, opt, {"epoch": 2})
    finally:
        os.replace = real_replace
    assert os.path.islink(link) and os.readlink(link) == os.path.join("..", "store", "real.npz")
    assert int(checkpoint.read(str(target))["state/epoch"]) == 2
    [(src, dst)] = replaced
    assert os.path.dirname(src) == os.path.dirname(dst) == str(tmp_path / "store")
    assert sorted(os.listdir(tmp_path / "store")) == ["real.npz"]


def test_the_trainer_checkpoints_through_a_symlink(tmp_path, capsys):
    target, link = tmp_path / "real.npz", tmp_path / "link.npz"
    os.symlink("real.npz", link)
    assert train(["--epochs", 1, "--checkpoint", link], capsys)[0] == 0
    assert os.path.islink(link) and int(checkpoint.read(str(target))["state/epoch"]) == 1
    code, out, err = train(["--epochs", 2, "--checkpoint", link, "--resume"], capsys)
    assert code == 0, err
    assert os.path.islink(link) and int(checkpoint.read(str(target))["state/epoch"]) == 2


# ---------------------------------------------------------------- resuming with nothing to do


def test_resuming_with_no_epoch_left_says_so_in_one_line(tmp_path, capsys):
    """Before: the banner and 'resumed from', then nothing, exit 0, as if it had trained."""
    ck, metrics = tmp_path / "ck.npz", tmp_path / "m.jsonl"
    assert train(["--epochs", 2, "--checkpoint", ck, "--metrics", metrics], capsys)[0] == 0
    rows, saved = metrics.read_text(), ck.read_bytes()
    for epochs in (2, 1):
        code, out, err = train(["--epochs", epochs, "--checkpoint", ck, "--resume",
                                "--metrics", metrics], capsys)
        assert code == 0, (out, err)
        assert err == "" and len(out.splitlines()) == 1, (out, err)
        assert out.startswith("train_mlp.py: nothing to do: ") and "epoch 2" in out, out
        assert f"--epochs {epochs}" in out, out
        assert metrics.read_text() == rows and ck.read_bytes() == saved


def test_resuming_at_an_epochs_end_writes_no_bogus_row(tmp_path, capsys):
    """A run stopped by --max-steps at an epoch's last step saved (epoch 0, step S) and
    wrote no row for epoch 1. Before, the resumed run wrote one for it, with loss 0.0 and
    train accuracy 0.0 (no step of it ran). Now its first row is epoch 2, the same as
    in a run never interrupted (the resume is bitwise)."""
    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    code, out, _ = train(["--epochs", 2, "--metrics", whole], capsys)
    assert code == 0
    steps = int(re.search(r"(\d+) steps/epoch", out).group(1))
    ck = tmp_path / "ck.npz"
    code, _, _ = train(["--epochs", 2, "--max-steps", steps, "--checkpoint", ck,
                        "--metrics", part], capsys)
    assert code == 0
    state = checkpoint.read(str(ck))
    assert (int(state["state/epoch"]), int(state["state/step"])) == (0, steps)
    assert part.read_text() == ""  # stopped before the epoch's row
    code, out, err = train(["--epochs", 2, "--checkpoint", ck, "--resume", "--metrics", part],
                           capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in part.read_text().splitlines()]
    expected = json.loads(whole.read_text().splitlines()[1])
    assert [r["epoch"] for r in rows] == [2], rows
    for key in ("loss", "train_acc", "test_acc"):
        assert rows[0][key] == expected[key], key
    assert "epoch   1" not in out, out


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("none", None), ("0.5", 0.5)])
def test_piece_mb_takes_auto_none_or_a_size(text, value):
    from mpidp.training.trainer import piece_mb

    assert piece_mb(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "inf", "nan", "big"])
def test_piece_mb_refuses_what_is_not_a_finite_size_above_0(text):
    import argparse

    from mpidp.training.trainer import piece_mb

    with pytest.raises(argparse.ArgumentTypeError, match="auto, none or a size in MiB above 0"):
        piece_mb(text)


# ---------------------------------------------------------------- progress, --help


def test_progress_shows_under_mpiexec_by_default_as_lines_from_rank_0(tmp_path, mpiexec):
    """Before: --progress auto asked isatty(), false on every rank under mpiexec, so no
    progress ever showed there. Now rank 0 prints lines (its stdout is a pipe), each whole,
    never inside another row, once per step here (--progress-every 0)."""
    import subprocess
    import sys

    argv = [a for a in SMALL if a not in ("--progress", "never")]
    done = subprocess.run([*mpiexec, "-n", "2", sys.executable, TRAIN, *argv, "--epochs", "2",
                           "--progress-every", "0"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    steps = int(re.search(r"(\d+) steps/epoch", done.stdout).group(1))
    for epoch in (1, 2):
        shown = [m.group(1) for m in (re.match(rf"epoch {epoch}: step (\d+)/{steps}\b", line)
                                      for line in lines) if m]
        assert shown == [str(k) for k in range(1, steps + 1)], lines  # once: rank 0 alone
        row = next(i for i, line in enumerate(lines) if line.startswith(f"epoch {epoch:3d}"))
        last = max(i for i, line in enumerate(lines) if line.startswith(f"epoch {epoch}: "))
        assert last < row, lines  # the epoch's progress, then its row
    assert "\r" not in done.stdout + done.stderr


def test_the_bar_is_erased_before_any_other_row_and_redrawn_after(monkeypatch, capsys):
    """Before: on a terminal the GPT's evaluation row was printed onto the bar's line."""
    from mpidp.training.trainer import Progress

    clock = iter(range(100))
    monkeypatch.setattr("time.perf_counter", lambda: float(next(clock)))
    bar = Progress("bar", 10, "epoch 1")
    bar.update(3)
    bar.clear()
    print("step     3  loss 1.0")
    bar.update(4)
    bar.close()
    out, err = capsys.readouterr()
    assert out == "step     3  loss 1.0\n"
    assert err.startswith("\repoch 1 [") and err.endswith("\r")
    parts = err.split("\r")  # '', the bar at 3, blanks, '', the bar at 4, blanks, ''
    assert "3/10" in parts[1] and parts[2].strip() == "", err  # erased before the row
    assert "4/10" in parts[4] and parts[5].strip() == "", err  # drawn again after it


def test_help_shows_every_default_and_the_learning_rate_in_words(capsys):
    """Before: no defaults, and --lr's help was a raw dict: {'sgd': 0.05, ...}."""
    with pytest.raises(SystemExit) as info:
        trainer().main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for shown in ("--bucket-mb BUCKET_MB 0: one bucket per layer (default: 25.0)",
                  "(default: 0.9)", "--epochs EPOCHS passes over the training set (default: 12)",
                  "(default: 128,64)",
                  "default: 0.05 with sgd, 0.001 with adam or adamw"):
        assert shown in out, out
    assert "{'sgd'" not in out and "(default: None)" not in out and "(default: False)" not in out
