"""Checkpoints: atomic .npz, bitwise-identical resume, clear errors for bad files."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile

import numpy as np
import pytest
from mpi4py import MPI

from mpidp.training import MLP, SGD, softmax_cross_entropy
from mpidp.training.checkpoint import CheckpointError, load, read, save

HERE = os.path.dirname(__file__)


def trainer():
    """examples/train_mlp.py as a module (the examples folder is not a package)."""
    path = os.path.join(HERE, "..", "examples", "train_mlp.py")
    spec = importlib.util.spec_from_file_location("train_mlp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trained(steps=3, sizes=(6, 5, 3)):
    model = MLP(list(sizes), dtype="float64", seed=1)
    opt = SGD(model.params, model.grads, lr=0.1, momentum=0.9, weight_decay=0.01)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x, y = rng.standard_normal((4, sizes[0])), rng.integers(0, sizes[-1], 4)
        model.backward(softmax_cross_entropy(model.forward(x), y)[1])
        opt.step()
    return model, opt


def test_round_trip_restores_params_and_optimizer_bitwise(tmp_path):
    path = str(tmp_path / "ck.npz")
    model, opt = trained()
    save(path, model, opt, {"epoch": 2, "step": 5, "seed": 0})
    assert os.listdir(tmp_path) == ["ck.npz"]  # the temporary file was renamed, not left
    fresh = MLP([6, 5, 3], dtype="float64", seed=99)
    fresh_opt = SGD(fresh.params, fresh.grads, lr=0.1, momentum=0.9)
    state = load(path, fresh, fresh_opt)
    assert state == {"epoch": 2, "step": 5, "seed": 0}
    for k in model.params:
        assert np.array_equal(fresh.params[k], model.params[k])
        assert np.array_equal(fresh_opt.velocity[k], opt.velocity[k])
    assert fresh_opt.steps == opt.steps == 3
    with zipfile.ZipFile(path) as z:  # stable names, plain arrays
        assert {"param/W1.npy", "param/b2.npy", "optim/velocity/W1.npy",
                "state/epoch.npy"} <= set(z.namelist())


def test_truncated_corrupt_missing_and_foreign_files_are_clear_errors(tmp_path):
    path = str(tmp_path / "ck.npz")
    model, opt = trained()
    save(path, model, opt, {"epoch": 1, "step": 0})
    blob = open(path, "rb").read()
    before = {k: v.copy() for k, v in model.params.items()}

    (tmp_path / "short.npz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load(str(tmp_path / "short.npz"), model, opt)

    flipped = bytearray(blob)
    flipped[blob.find(model.params["W1"].tobytes()) + 5] ^= 0xFF  # one bit pattern in W1's data
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="CRC"):  # the zip's checksum catches it
        load(str(tmp_path / "flipped.npz"), model, opt)

    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load(str(tmp_path / "missing.npz"), model, opt)

    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(CheckpointError, match="not an mpidp checkpoint"):
        read(str(tmp_path / "other.npz"))

    np.savez(tmp_path / "pickled.npz", format=np.array(1), x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="Python objects") as info:  # never unpickles
        read(str(tmp_path / "pickled.npz"))
    assert "allow_pickle" not in str(info.value)  # never suggests unpickling either

    for k in model.params:  # nothing was changed by the failed loads
        assert np.array_equal(model.params[k], before[k])


def test_a_corrupt_later_entry_leaves_every_parameter_untouched(tmp_path):
    """A flipped byte past the first 4 KiB of a later entry: zipfile reads a member 4 KiB at
    a time and checks its CRC at the end, so only reading the whole entry finds it; by
    then nothing may have been written (load reads every entry, then writes)."""
    path = str(tmp_path / "ck.npz")
    model, opt = trained(sizes=(6, 40, 20))  # W2: 40 x 20 float64, 6400 bytes
    save(path, model, opt, {"epoch": 1, "step": 0})
    blob = open(path, "rb").read()
    for entry, data in (("param/W2", model.params["W2"]),
                        ("optim/velocity/W2", opt.velocity["W2"])):
        assert data.nbytes > 4096  # its last byte lies past zipfile's first read
        flipped = bytearray(blob)
        flipped[blob.find(data.tobytes()) + data.nbytes - 1] ^= 0xFF  # its last byte
        bad = tmp_path / "bad.npz"
        bad.write_bytes(bytes(flipped))
        fresh = MLP([6, 40, 20], dtype="float64", seed=5)
        fresh_opt = SGD(fresh.params, fresh.grads, lr=0.1, momentum=0.9)
        before = {k: v.copy() for k, v in fresh.params.items()}
        assert not any(np.array_equal(before[k], model.params[k]) for k in before)
        with pytest.raises(CheckpointError, match=f"{entry}: .*CRC"):
            load(str(bad), fresh, fresh_opt)
        changed = [k for k in before if not np.array_equal(fresh.params[k], before[k])]
        assert not changed, f"{entry} corrupt, yet {changed} were written"  # W1, b1 come first
        assert fresh_opt.steps == 0 and fresh_opt.velocity == {}


def test_a_checkpoint_of_another_model_is_refused_before_anything_changes(tmp_path):
    path = str(tmp_path / "ck.npz")
    model, opt = trained(sizes=(6, 5, 3))
    save(path, model, opt, {"epoch": 1, "step": 0})
    other = MLP([6, 7, 3], dtype="float64", seed=3)
    before = {k: v.copy() for k, v in other.params.items()}
    with pytest.raises(CheckpointError, match=r"different model: sizes \[6, 5, 3\]"):
        load(path, other, SGD(other.params, other.grads))
    assert all(np.array_equal(other.params[k], before[k]) for k in before)
    f32 = MLP([6, 5, 3], dtype="float32", seed=3)
    with pytest.raises(CheckpointError, match="dtype float64 vs float32"):
        load(path, f32, SGD(f32.params, f32.grads))


def final_params(path):
    data = read(path)
    return {k: v for k, v in data.items() if k.startswith(("param/", "optim/"))}


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(mpi_ranks, shared_dir, capsys):
    comm = MPI.COMM_WORLD
    folder = shared_dir  # every rank reads the files rank 0 writes
    train = trainer().main
    common = ["--epochs", "3", "--global-batch", "240", "--hidden", "32", "--dtype", "float64",
              "--bucket-mb", "0", "--progress", "never"]
    whole, part = os.path.join(folder, "whole.npz"), os.path.join(folder, "part.npz")
    metrics = os.path.join(folder, "metrics.jsonl")
    train(common + ["--checkpoint", whole, "--metrics", metrics])
    train(common + ["--checkpoint", part, "--max-steps", "7"])  # stops mid-epoch 2
    comm.Barrier()  # rank 0 has written part.npz
    state = read(part)
    assert (int(state["state/epoch"]), int(state["state/step"])) == (1, 2)
    train(common + ["--checkpoint", part, "--resume"])
    comm.Barrier()
    a, b = final_params(whole), final_params(part)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    if comm.Get_rank() == 0:
        rows = [json.loads(line) for line in open(metrics)]
        assert [r["epoch"] for r in rows] == [1, 2, 3]
        for key in ("loss", "train_acc", "test_acc", "samples_per_s", "forward_ms",
                    "backward_ms", "exposed_comm_ms"):
            assert all(isinstance(r[key], float) for r in rows), key
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:  # on every rank, with one line on rank 0
        train([*common[:2], "--global-batch", "120", *common[4:], "--checkpoint", part,
               "--resume"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    if comm.Get_rank() == 0:
        assert "global_batch=240, this run has 120" in err and len(err.splitlines()) == 1, err
    else:
        assert err == ""


def test_resume_without_a_checkpoint_file_is_an_error_not_a_fresh_start(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        trainer().main(["--checkpoint", str(tmp_path / "none.npz"), "--resume",
                        "--progress", "never"])
    assert info.value.code == 2
    assert "no such checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "none.npz").exists()


def test_an_existing_checkpoint_is_not_overwritten_without_overwrite(tmp_path, capsys):
    path = tmp_path / "ck.npz"
    common = ["--epochs", "1", "--global-batch", "960", "--hidden", "8", "--progress", "never",
              "--data", "synthetic", "--checkpoint", str(path)]
    train = trainer().main
    assert train(common) == 0
    before = path.read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        train([*common, "--lr", "0.5"])  # another run, same file
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--overwrite" in err and len(err.splitlines()) == 1, err
    assert path.read_bytes() == before  # untouched
    assert train([*common, "--lr", "0.5", "--overwrite"]) == 0
    assert path.read_bytes() != before


# ---------------------------------------------------------------- the whole file, checked first


def _rewrite(src, dst, change):
    """Copy checkpoint `src` to `dst` with `change(arrays)` applied to its entries."""
    arrays = read(src)
    change(arrays)
    np.savez(dst, **arrays)
    return dst


BROKEN = {  # what is changed -> what the error says
    "optim/steps missing": (lambda a: a.pop("optim/steps"), "optim/steps: missing"),
    "velocity missing": (lambda a: a.pop("optim/velocity/W2"), "optim/velocity/W2: missing"),
    "velocity shape": (lambda a: a.update({"optim/velocity/W1": np.zeros((5, 6))}),
                       r"optim/velocity/W1: float64 of shape \(5, 6\), expected float64"),
    "velocity dtype": (lambda a: a.update({"optim/velocity/b1": np.zeros(5, np.float32)}),
                       "optim/velocity/b1: float32"),
    "steps not a number": (lambda a: a.update({"optim/steps": np.array([3, 3])}),
                           "optim/steps"),
    "unknown entry": (lambda a: a.update({"param/W9": np.zeros(2)}), "param/W9: not expected"),
    "unknown optimizer state": (lambda a: a.update({"optim/m/W1": np.zeros((6, 5))}),
                                "optim/m/W1: not expected"),
    "state not an integer": (lambda a: a.update({"state/epoch": np.array(1.5)}),
                             "state/epoch: float64"),
    "sizes missing": (lambda a: a.pop("sizes"), "sizes missing"),
    "activation missing": (lambda a: a.pop("activation"), "activation missing"),
    "dtype missing": (lambda a: a.pop("dtype"), "dtype missing"),
    "format version": (lambda a: a.update({"format": np.array(4)}), "format 4"),
    "optimizer missing": (lambda a: a.pop("optimizer"), "optimizer missing"),
    "another optimizer": (lambda a: a.update({"optimizer": np.array("adam")}),
                          "optimizer adam vs sgd"),
    "pickled velocity": (lambda a: a.update({"optim/velocity/W1": np.array([{}], object)}),
                         "Python objects"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_load_checks_the_whole_file_before_changing_anything(tmp_path, case):
    change, message = BROKEN[case]
    model, opt = trained()
    good = str(tmp_path / "good.npz")
    save(good, model, opt, {"epoch": 1, "step": 0})
    bad = _rewrite(good, str(tmp_path / "bad.npz"), change)
    fresh = MLP([6, 5, 3], dtype="float64", seed=7)
    fresh_opt = SGD(fresh.params, fresh.grads, lr=0.1, momentum=0.9)
    before = {k: v.copy() for k, v in fresh.params.items()}
    with pytest.raises(CheckpointError, match=message) as info:
        load(bad, fresh, fresh_opt)
    assert "allow_pickle" not in str(info.value)
    assert all(np.array_equal(fresh.params[k], before[k]) for k in before)
    assert fresh_opt.steps == 0 and fresh_opt.velocity == {}
    load(good, fresh, fresh_opt)  # the untouched file loads into the same objects
    assert fresh_opt.steps == 3


def test_state_keys_asked_for_must_be_there(tmp_path):
    path = str(tmp_path / "ck.npz")
    model, opt = trained()
    save(path, model, opt, {"epoch": 1})
    with pytest.raises(CheckpointError, match="state/step: missing"):
        load(path, model, opt, state_keys=["epoch", "step"])
    assert load(path, model, opt, state_keys=["epoch"]) == {"epoch": 1}


def _npz_with_a_big_member(path, name, shape):
    """A valid checkpoint whose entry `name` is a compressed all-zero array of `shape`:
    a few hundred kB on disk, shape's float64 bytes once decompressed."""
    model, opt = trained()
    save(path, model, opt, {"epoch": 1})
    arrays = read(path)
    arrays.pop(name, None)
    np.savez(path, **arrays)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open(name + ".npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f8", "fortran_order": False, "shape": shape})
            chunk = bytes(1 << 20)
            for _ in range(int(np.prod(shape)) * 8 // len(chunk)):
                f.write(chunk)


@pytest.mark.parametrize("name", ["param/W1", "optim/velocity/W1", "param/W9", "sizes"])
def test_sizes_are_checked_before_anything_is_decompressed(tmp_path, name):
    path = str(tmp_path / "bomb.npz")
    _npz_with_a_big_member(path, name, (64, 1 << 15))  # 16 MiB of float64 zeros
    assert os.path.getsize(path) < 1 << 20
    model, opt = trained()
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as info:
            load(path, model, opt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"loading allocated {peak / 2**20:.1f} MiB"
    assert name in str(info.value)


# ---------------------------------------------------------------- crash safety of save


def test_a_reader_of_the_old_checkpoint_keeps_it_whole(tmp_path):
    """The new file is renamed over the old one, not copied into it: a reader that has
    the old file open (a resuming rank, a backup) keeps reading the old one, whole."""
    path = str(tmp_path / "ck.npz")
    model, opt = trained(steps=1)
    save(path, model, opt, {"epoch": 1})
    old = open(path, "rb").read()
    with open(path, "rb") as reader:
        model2, opt2 = trained(steps=5)
        save(path, model2, opt2, {"epoch": 2})
        assert reader.read() == old
    assert read(path)["state/epoch"] == 2


def test_a_write_that_fails_midway_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ck.npz")
    model, opt = trained(steps=1)
    save(path, model, opt, {"epoch": 1})
    old = open(path, "rb").read()
    write_array, written = np.lib.format.write_array, []

    def write_some(f, array, **kw):
        if len(written) == 5:
            raise OSError(28, "No space left on device")
        written.append(array)
        write_array(f, array, **kw)

    monkeypatch.setattr(np.lib.format, "write_array", write_some)
    model2, opt2 = trained(steps=5)
    with pytest.raises(OSError, match="No space"):
        save(path, model2, opt2, {"epoch": 2})
    assert written, "the failure came before anything was written"
    assert open(path, "rb").read() == old
    assert os.listdir(tmp_path) == ["ck.npz"]  # no temporary file left either


def test_a_writer_killed_midway_leaves_the_old_checkpoint(tmp_path):
    """SIGKILL in the middle of np.savez: the old file is whole and loads."""
    path = str(tmp_path / "ck.npz")
    model, opt = trained(steps=1)
    save(path, model, opt, {"epoch": 1})
    old = open(path, "rb").read()
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        sys.path.insert(0, {HERE!r})
        from test_checkpoint import trained
        from mpidp.training.checkpoint import save
        write_array, count = np.lib.format.write_array, [0]
        def write_then_die(f, array, **kw):
            write_array(f, array, **kw)
            count[0] += 1
            if count[0] == 5:
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        np.lib.format.write_array = write_then_die
        model, opt = trained(steps=5)
        save({path!r}, model, opt, {{"epoch": 2}})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert open(path, "rb").read() == old
    fresh, fresh_opt = trained(steps=0)
    assert load(path, fresh, fresh_opt) == {"epoch": 1}
    assert all(np.array_equal(fresh.params[k], model.params[k]) for k in model.params)


def test_save_syncs_the_data_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    path = str(tmp_path / "ck.npz")
    events = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", os.path.basename(target) if target != str(tmp_path) else "."))
        fsync(fd)

    def record_replace(src, dst):
        events.append(("replace", os.path.basename(src), os.path.basename(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    model, opt = trained()
    save(path, model, opt, {"epoch": 1})
    tmp = events[0][1]  # mkstemp's name beside the target (mpidp.files)
    assert re.fullmatch(r"\.ck\.npz\.\w{8}\.tmp", tmp), tmp
    assert events == [("fsync", tmp), ("replace", tmp, "ck.npz"), ("fsync", ".")], events


# ---------------------------------------------------------------- what a resume must match


def run(argv, capsys):
    """(exit code, stdout, stderr) of train_mlp.py's main in this process, on one rank."""
    capsys.readouterr()
    try:
        code = trainer().main([*map(str, argv)])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


TINY = ["--global-batch", "960", "--hidden", "8", "--progress", "never", "--data", "synthetic"]


@pytest.mark.parametrize("changed, says", [
    (["--deterministic", "--micro-batch", "16"], ["micro_batch=8, this run has 16"]),
    ([], ["deterministic=True, this run has False"]),
    (["--deterministic", "--lr", "0.1"], ["lr=0.05, this run has 0.1"]),
    (["--deterministic", "--momentum", "0.5", "--weight-decay", "0"],
     ["momentum=0.9, this run has 0.5", "weight_decay=0.0001, this run has 0.0"]),
])
def test_resume_refuses_each_setting_that_would_change_the_result(tmp_path, capsys, changed,
                                                                  says):
    """Before: a changed --micro-batch, a resume without --deterministic, another --lr...
    trained on from the checkpoint, exit 0, and the bits then differed from the run never
    interrupted. Now each is named, in one line, exit 2, the checkpoint untouched."""
    ck = tmp_path / "ck.npz"
    assert run([*TINY, "--epochs", 1, "--deterministic", "--checkpoint", ck], capsys)[0] == 0
    saved = ck.read_bytes()
    code, out, err = run([*TINY, "--epochs", 2, "--checkpoint", ck, "--resume", *changed],
                         capsys)
    assert code == 2, (code, out, err)
    assert len(err.splitlines()) == 1 and err.startswith("train_mlp.py: error: "), err
    for s in says:
        assert s in err, err
    assert ck.read_bytes() == saved
    code, _, err = run([*TINY, "--epochs", 2, "--checkpoint", ck, "--resume", "--deterministic"],
                       capsys)
    assert code == 0, err  # the same settings resume


def test_settings_that_do_not_change_the_result_may_change_on_resume(tmp_path, capsys):
    """The rank count, buckets, algorithm, ZeRO stage and overlap change no bit under
    --deterministic (test_determinism.py): they are not recorded, a resume may change them."""
    ck = tmp_path / "ck.npz"
    assert run([*TINY, "--epochs", 1, "--deterministic", "--checkpoint", ck], capsys)[0] == 0
    code, _, err = run([*TINY, "--epochs", 2, "--checkpoint", ck, "--resume", "--deterministic",
                        "--bucket-mb", "0", "--algorithm", "ring", "--no-overlap",
                        "--zero", "1"], capsys)
    assert code == 0, err


def _as_format_2(path):
    """Rewrite the checkpoint at `path` as the last mpidp wrote it: format 2, its data order
    in state/ (seed, global_batch, accum_steps), no settings."""
    arrays = read(path)
    settings = json.loads(str(arrays.pop("settings")))
    arrays["format"] = np.array(2)
    for key in ("seed", "global_batch", "accum_steps"):
        arrays[f"state/{key}"] = np.array(settings[key])
    np.savez(path, **arrays)


def test_a_format_2_checkpoint_resumes_with_a_note_of_what_it_does_not_record(tmp_path, capsys):
    ck = tmp_path / "ck.npz"
    assert run([*TINY, "--epochs", 1, "--checkpoint", ck], capsys)[0] == 0
    _as_format_2(str(ck))
    code, out, err = run([*TINY, "--epochs", 2, "--checkpoint", ck, "--resume",
                          "--global-batch", "480"], capsys)
    assert code == 2 and "global_batch=960, this run has 480" in err, err
    code, out, err = run([*TINY, "--epochs", 2, "--checkpoint", ck, "--resume"], capsys)
    assert code == 0, err
    [note] = [line for line in out.splitlines() if "format 2" in line]
    assert "does not record" in note and "lr" in note and "deterministic" in note, note
    assert int(read(str(ck))["format"]) == 3  # the next save is today's format


def _edit(path, **state):
    arrays = read(path)
    arrays.update({k.replace("__", "/"): np.array(v) for k, v in state.items()})
    np.savez(path, **arrays)


@pytest.mark.parametrize("edit, says", [
    ({"state__step": -3}, "state/step: -3 is out of range"),
    ({"state__epoch": -1}, "state/epoch: -1 is out of range"),
    ({"state__step": 10**6}, "step 1000000"),
    ({"optim__steps": -2}, "optim/steps: -2 is out of range"),
    ({"optim__steps": 5}, "optim/steps"),
    ({"state__step": True}, "state/step: True is not a whole number"),
])
def test_checkpoint_integers_out_of_range_are_refused_in_one_line(tmp_path, capsys, edit, says):
    """Before: step=-3 trained from step -3, step=10**6 wrote an epoch row of loss 0.0,
    epoch=-1 ended in a traceback."""
    ck, metrics = tmp_path / "ck.npz", tmp_path / "m.jsonl"
    assert run([*TINY, "--epochs", 1, "--max-steps", 2, "--checkpoint", ck], capsys)[0] == 0
    _edit(str(ck), **edit)
    code, out, err = run([*TINY, "--epochs", 2, "--checkpoint", ck, "--resume",
                          "--metrics", metrics], capsys)
    assert code == 2, (code, out, err)
    assert len(err.splitlines()) == 1 and says in err, err
    assert not metrics.exists() or metrics.read_text() == ""


def test_resuming_at_max_steps_runs_no_more_step(tmp_path, capsys):
    """Before: train_mlp.py resumed at --max-steps ran one more step (and saved it)."""
    ck = tmp_path / "ck.npz"
    assert run([*TINY, "--max-steps", 3, "--checkpoint", ck], capsys)[0] == 0
    saved = ck.read_bytes()
    code, out, err = run([*TINY, "--max-steps", 3, "--checkpoint", ck, "--resume"], capsys)
    assert code == 0, err
    assert out.startswith("train_mlp.py: nothing to do: ") and "--max-steps 3" in out, out
    assert len(out.splitlines()) == 1 and ck.read_bytes() == saved


@pytest.mark.parametrize("state, says", [({"epoch": 0, "step": 9}, "past the 4 steps"),
                                         ({"epoch": 1, "step": 0}, "optim/steps 3")])
def test_a_refused_resume_leaves_the_model_and_optimizer_unchanged(tmp_path, state, says):
    """resume's own checks (the step within an epoch, the optimizer's step count) refuse
    before anything is loaded: the model and optimizer are as they were."""
    from mpidp.training.resume import resume

    path = str(tmp_path / "ck.npz")
    model, opt = trained()
    save(path, model, opt, state)
    fresh = MLP([6, 5, 3], dtype="float64", seed=99)
    fresh_opt = SGD(fresh.params, fresh.grads, lr=0.1, momentum=0.9, weight_decay=0.01)
    before = {k: v.copy() for k, v in fresh.params.items()}
    with pytest.raises(CheckpointError, match=says):
        resume(path, fresh, fresh_opt, None, 4)
    for k in before:
        assert np.array_equal(fresh.params[k], before[k]), k
    assert fresh_opt.steps == 0 and not any(np.any(v) for v in fresh_opt.velocity.values())
