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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# ---------------------------------------------------------------- mutated checkpoints (Hypothesis)

SETTINGS = {"seed": 0, "global_batch": 8, "lr": 0.1, "deterministic": False,
            "micro_batch": None, "hidden": [5]}


class Good(tuple):
    def __repr__(self):  # what Hypothesis prints of a failing case: not the whole file
        return "<the valid checkpoint>"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A valid checkpoint's bytes and what loading it gives."""
    path = str(tmp_path_factory.mktemp("ck") / "good.npz")
    model, opt = trained()
    checkpoint.save(path, model, opt, {"epoch": 1, "step": 2}, SETTINGS)
    with open(path, "rb") as f:
        blob = f.read()
    return Good((blob, {k: v.copy() for k, v in model.params.items()}))


def _load_or_refuse(path, params):
    """Load `path` into a fresh model: a CheckpointError (nothing changed), or a correct load:
    the parameters `params`, every state integer in range, the settings the run's."""
    model, opt = trained(0)
    before = {k: v.copy() for k, v in model.params.items()}
    try:
        state = checkpoint.load(path, model, opt, state_keys=["epoch", "step"],
                                settings=SETTINGS)
    except CheckpointError as e:
        assert "\n" not in str(e)
        assert all(np.array_equal(model.params[k], before[k]) for k in before)  # untouched
        return None
    for k, v in params.items():
        assert model.params[k].tobytes() == v.tobytes(), k
    assert all(type(v) is int and 0 <= v <= 2**53 for v in state.values()), state
    assert type(opt.steps) is int and 0 <= opt.steps <= 2**53, opt.steps
    return state


hostile = settings(max_examples=150, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])


@hostile
@given(data=st.data())
def test_bit_flips_and_truncations_are_refused_or_load_the_saved_values(tmp_path, good, data):
    blob, params = good
    mutated = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob) - 1))
        mutated[at] ^= 1 << data.draw(st.integers(0, 7))
    if data.draw(st.booleans()):
        mutated = mutated[:data.draw(st.integers(0, len(mutated)))]
    path = tmp_path / "mutated.npz"
    path.write_bytes(bytes(mutated))
    state = _load_or_refuse(str(path), params)
    assert state in (None, {"epoch": 1, "step": 2})



@pytest.mark.parametrize("field, value", [(8, 0x1), (10, 0x63)], ids=["encrypted", "method"])
def test_an_entry_marked_encrypted_or_oddly_compressed_is_refused(tmp_path, good, field, value):
    """Hypothesis found these two flips (zipfile raised RuntimeError, NotImplementedError):
    an entry's central-directory flag "encrypted" (offset 8) or an unknown method (10)."""
    blob, params = good
    mutated = bytearray(blob)
    at = blob.index(b"PK\x01\x02")  # the first entry's central directory record
    mutated[at + field] = value
    path = tmp_path / "mutated.npz"
    path.write_bytes(bytes(mutated))
    assert _load_or_refuse(str(path), params) is None

ENTRIES = ["format", "sizes", "activation", "dtype", "optimizer", "settings", "param/W1",
           "param/b2", "optim/steps", "optim/velocity/W1", "state/epoch", "state/step"]
ODD = st.one_of(
    st.integers(-2**63, 2**63 - 1).map(np.int64), st.integers(0, 2**64 - 1).map(np.uint64),
    st.floats().map(np.float64), st.booleans().map(np.bool_), st.text(max_size=30).map(np.str_),
    st.lists(st.integers(-5, 5), max_size=6).map(lambda v: np.array(v, dtype=np.int64)),
    st.tuples(st.integers(0, 7), st.integers(0, 7)).map(lambda s: np.zeros(s, np.float32)),
    st.tuples(st.integers(0, 7), st.integers(0, 7)).map(lambda s: np.ones(s)),
    st.sampled_from(['{"seed": 0', '[' * 200, '{"lr": NaN}', '{"seed": [[[1]]]}', "null"])
    .map(np.str_))


@hostile
@given(changes=st.dictionaries(st.sampled_from(ENTRIES), ODD, min_size=1, max_size=3),
       dropped=st.lists(st.sampled_from(ENTRIES), max_size=2))
def test_wrong_dtypes_shapes_and_values_are_refused_or_load(tmp_path, good, changes, dropped):
    """Entries replaced by other dtypes, shapes, out-of-range integers, broken settings, or
    dropped: a CheckpointError naming one, never another exception."""
    blob, params = good
    src = tmp_path / "good.npz"
    src.write_bytes(blob)
    arrays = checkpoint.read(str(src))
    arrays.update(changes)
    for name in dropped:
        arrays.pop(name, None)
    path = tmp_path / "changed.npz"
    np.savez(path, **arrays)
    _load_or_refuse(str(path), {k: arrays.get(f"param/{k}", v) for k, v in params.items()})
