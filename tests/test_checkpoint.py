"""Checkpoints: atomic .npz, bitwise-identical resume, clear errors for bad files."""

import importlib.util
import json
import os
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
    with pytest.raises(CheckpointError, match="corrupt"):  # never unpickles
        read(str(tmp_path / "pickled.npz"))

    for k in model.params:  # nothing was changed by the failed loads
        assert np.array_equal(model.params[k], before[k])


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
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(mpi_ranks, shared_dir):
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
    with pytest.raises(SystemExit, match="global_batch=240, this run has 120"):
        train([*common[:2], "--global-batch", "120", *common[4:], "--checkpoint", part,
               "--resume"])


def test_resume_without_a_checkpoint_file_is_an_error_not_a_fresh_start(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        trainer().main(["--checkpoint", str(tmp_path / "none.npz"), "--resume",
                        "--progress", "never"])
