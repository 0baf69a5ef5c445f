"""examples/train_gpt.py in this process, on one rank: its rows, its checks, resume = one run.

The N-rank equality of the training itself is test_gpt_ddp.py's; the shared
checks of flags and paths are the trainer module's, exercised through
train_mlp.py in test_outputs.py and test_failures.py.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "train_gpt.py")
TINY = ["--layers", "1", "--heads", "2", "--width", "8", "--context", "8", "--corpus-mb",
        "0.02", "--global-batch", "4", "--eval-tokens", "64", "--sample-tokens", "5",
        "--progress", "never", "--dtype", "float64"]


def run(argv, capsys) -> tuple[int, str, str]:
    spec = importlib.util.spec_from_file_location("train_gpt", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    try:
        code = module.main([*TINY, *map(str, argv)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_one_row_per_evaluation_with_the_issue_fields(tmp_path, capsys):
    m = tmp_path / "m.jsonl"
    code, out, _ = run(["--max-steps", "5", "--eval-every", "2", "--metrics", m], capsys)
    assert code == 0
    rows = [json.loads(line) for line in m.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4, 5]  # before the first step, every 2, the end
    for r in rows:
        assert {"step", "loss", "val_loss", "tokens_per_s", "memory_bytes"} <= set(r)
        assert np.isfinite(r["loss"]) and np.isfinite(r["val_loss"]) and r["memory_bytes"] > 0
    assert rows[0]["tokens_per_s"] == 0 and all(r["tokens_per_s"] > 0 for r in rows[1:])
    assert "unigram" in out and "sample:\ndef " in out


def test_a_resumed_run_equals_one_run(tmp_path, capsys):
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    assert run(["--max-steps", "4", "--checkpoint", one], capsys)[0] == 0
    assert run(["--max-steps", "2", "--checkpoint", two], capsys)[0] == 0
    code, out, _ = run(["--max-steps", "4", "--checkpoint", two, "--resume"], capsys)
    assert code == 0 and "resumed" in out
    a, b = np.load(one), np.load(two)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        if k.startswith(("param/", "optim/")):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # bitwise: one process
    code, out, _ = run(["--max-steps", "4", "--checkpoint", two, "--resume"], capsys)
    assert code == 0 and "nothing to do" in out


def test_zero_3_trains_as_zero_0_and_its_checkpoint_resumes_at_zero_0(tmp_path, capsys):
    """--zero 3 on one rank: every evaluation, the sample and the checkpoint run on the
    gathered parameters; the losses are stage 0's, and stage 0 resumes its checkpoint."""
    rows = {}
    for zero in (0, 3):
        m, ck = tmp_path / f"m{zero}.jsonl", tmp_path / f"ck{zero}.npz"
        argv = ["--max-steps", "3", "--eval-every", "2", "--zero", zero, "--metrics", m,
                "--checkpoint", ck]
        assert run(argv, capsys)[0] == 0
        rows[zero] = [json.loads(line) for line in m.read_text().splitlines()]
    for a, b in zip(rows[0], rows[3], strict=True):
        assert b["zero"] == 3 and a["step"] == b["step"]
        np.testing.assert_allclose([b["loss"], b["val_loss"]], [a["loss"], a["val_loss"]],
                                   rtol=1e-12)
    code, out, _ = run(["--max-steps", "4", "--checkpoint", tmp_path / "ck3.npz", "--resume"],
                       capsys)
    assert code == 0 and "resumed" in out


@pytest.mark.parametrize("argv, says", [
    (["--width", "9"], "not a multiple of --heads"),
    (["--global-batch", "100000"], "--global-batch"),
    (["--resume"], "--resume needs --checkpoint"),
    (["--zero", "1", "--algorithm", "naive"], "reduce-scatter"),
    (["--comm-hook", "fp8"], "--comm-hook: 'fp8': expected one of none, fp16, bf16, powersgd:R"),
    (["--comm-hook", "powersgd:0"], "--comm-hook: 'powersgd:0'"),
    (["--comm-hook", "fp16", "--dtype", "float32", "--zero", "1"], "--comm-hook with --zero"),
    (["--comm-hook", "powersgd:2", "--deterministic"], "--comm-hook with --deterministic"),
    (["--comm-hook", "bf16"], "--comm-hook bf16 compresses float32 gradients, not float64"),
    (["--comm-hook", "bf16", "--progress-thread"], "--comm-hook with --progress-thread"),
    (["--comm-hook", "powersgd:2", "--checkpoint", "c.npz", "--resume"],
     "a checkpoint does not hold PowerSGD's state"),
])
def test_bad_flags_exit_2_in_one_line(argv, says, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_comm_hook_reaches_the_buckets(tmp_path, capsys):
    """--comm-hook bf16 rounds every gradient (one rank too): its losses leave none's."""
    rows = {}
    for hook in ("none", "bf16"):
        m = tmp_path / f"{hook}.jsonl"
        argv = ["--max-steps", "3", "--dtype", "float32", "--comm-hook", hook, "--metrics", m]
        assert run(argv, capsys)[0] == 0
        rows[hook] = [json.loads(line)["loss"] for line in m.read_text().splitlines()]
    assert rows["none"][0] == rows["bf16"][0] and rows["none"][-1] != rows["bf16"][-1]
    ck, f32 = tmp_path / "ck.npz", ["--dtype", "float32"]
    first = ["--max-steps", "2", *f32, "--comm-hook", "bf16", "--checkpoint", ck]
    assert run(first, capsys)[0] == 0
    for hook, code in (("fp16", 2), ("bf16", 0)):  # the checkpoint records its hook
        argv = ["--max-steps", "3", *f32, "--comm-hook", hook, "--checkpoint", ck, "--resume"]
        assert run(argv, capsys)[0] == code, hook


def test_an_existing_checkpoint_needs_resume_or_overwrite(tmp_path, capsys):
    ck = tmp_path / "ck.npz"
    ck.write_bytes(b"old")
    code, _, err = run(["--max-steps", "1", "--checkpoint", ck], capsys)
    assert code == 2 and "--overwrite" in err and ck.read_bytes() == b"old"


@pytest.mark.parametrize("changed, says", [
    (["--corpus-mb", "0.021"], ["corpus_mb=0.02, this run has 0.021", "corpus='"]),
    (["--lr", "0.01", "--beta2", "0.99"], ["lr=0.003, this run has 0.01", "beta2=0.999"]),
])
def test_resume_refuses_another_corpus_or_optimizer_setting(tmp_path, capsys, changed, says):
    """Before: a different --corpus-mb (another corpus, vocabulary and split; none of them
    in the checkpoint) resumed with exit 0, and the bits differed from one run."""
    ck = tmp_path / "ck.npz"
    assert run(["--max-steps", "2", "--checkpoint", ck], capsys)[0] == 0
    code, _, err = run(["--max-steps", "4", "--checkpoint", ck, "--resume", *changed], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    for s in says:
        assert s in err, err


def test_a_corpus_too_small_for_any_held_out_sequence_is_refused(tmp_path, capsys):
    """Before: 0 held-out sequences, and every row said val_loss 0.0000, on screen and in
    --metrics, as if the model were perfect."""
    m = tmp_path / "m.jsonl"
    code, out, err = run(["--corpus-mb", "0.001", "--context", "128", "--max-steps", "1",
                          "--metrics", m], capsys)
    assert code == 2, (code, out, err)
    assert len(err.splitlines()) == 1 and "held-out" in err and "--context 128" in err, err
    assert "val 0.0000" not in out and not (m.exists() and m.read_text())


@pytest.mark.parametrize("mb", ["1e-9", "1e9", "0.0001"])
def test_corpus_sizes_out_of_bounds_are_a_usage_error(mb, capsys):
    """Before: 1e-9 ended in a ValueError traceback, 1e9 in a MemoryError."""
    code, out, err = run(["--corpus-mb", mb, "--max-steps", "1"], capsys)
    assert code == 2, (code, out, err)
    assert err.startswith("train_gpt.py: error: --corpus-mb") and len(err.splitlines()) == 1, err


def test_the_banner_says_deterministic_and_rows_say_what_the_optimizer_holds(tmp_path, capsys):
    """Before: the GPT's banner did not say "deterministic" as the MLP's does, and the
    step-0 row's memory_bytes, taken before the optimizer allocates its state, did not say
    that it holds none of it."""
    m = tmp_path / "m.jsonl"
    code, out, err = run(["--max-steps", "2", "--eval-every", "2", "--deterministic",
                          "--metrics", m], capsys)
    assert code == 0, err
    assert out.splitlines()[0].endswith(", deterministic"), out
    rows = [json.loads(line) for line in m.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2]
    assert rows[0]["optimizer_state_bytes"] == 0 < rows[1]["optimizer_state_bytes"]
    assert rows[1]["memory_bytes"] - rows[0]["memory_bytes"] == rows[1]["optimizer_state_bytes"]
