"""Checkpoints: one ``.npz`` holding everything a bitwise-identical resume needs.

Contents (every entry a plain array, so loading never unpickles):

    format, sizes, activation, dtype      what model this is
    optimizer                             sgd, adam or adamw (format 2; format 1: sgd)
    param/W1, param/b1, ...               the parameters, by their stable names
    optim/steps, optim/velocity/W1, ...   the optimizer state (Adam: optim/exp_avg/W1,
                                          optim/exp_avg_sq/W1, ...), whole, by name
    state/epoch, state/step, ...          where training stands, the data-order seed

The layout does not depend on the rank count or the ZeRO stage: a sharded run
saves ``ddp.full_optimizer()``, every rank's shard gathered, so a checkpoint of
any run loads into any other (`zero.py` takes each rank's shard on load).

Rank 0 writes to a temporary file beside the target, fsyncs it, and renames it
over the target: a crash leaves the old checkpoint or the new one, never half of
one. A truncated or corrupt file (the zip CRC catches flipped bits) or one for a
different model raises `CheckpointError` before anything is changed.
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

from ..collectives.buffers import as_host

FORMAT = 2  # 2: the optimizer's name; format 1 files (SGD) still load
READABLE = (1, 2)


class CheckpointError(Exception):
    """The checkpoint cannot be used: missing, corrupt, truncated, or for another model."""


def save(path: str, model, optimizer, state: dict) -> None:
    """Write `path` atomically. `state`: integers such as epoch, step, seed, global_batch."""
    arrays = {"format": np.array(FORMAT), "sizes": np.array(model.sizes, dtype=np.int64),
              "activation": np.array(model.activation), "dtype": np.array(str(model.dtype)),
              "optimizer": np.array(optimizer.name)}
    arrays.update({f"param/{k}": as_host(p) for k, p in model.params.items()})
    arrays.update({f"optim/{k}": as_host(v) if hasattr(v, "dtype") else np.array(v)
                   for k, v in optimizer.state_dict().items()})
    arrays.update({f"state/{k}": np.array(v) for k, v in state.items()})
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def read(path: str) -> dict:
    """Every array of the checkpoint, read and CRC-checked; CheckpointError if unreadable."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint "
                              f"({type(e).__name__}: {e})") from e
    if "format" not in data or int(data["format"]) not in READABLE:
        raise CheckpointError(f"{path}: not an mpidp checkpoint of format {READABLE}")
    return data


def load(path: str, model, optimizer) -> dict:
    """Restore the model and the optimizer from `path`; return the saved `state`."""
    data = read(path)
    mismatch = []
    if [int(s) for s in data["sizes"]] != model.sizes:
        mismatch.append(f"sizes {data['sizes'].tolist()} vs the model's {model.sizes}")
    if str(data["activation"]) != model.activation:
        mismatch.append(f"activation {data['activation']} vs {model.activation}")
    if str(data["dtype"]) != str(model.dtype):
        mismatch.append(f"dtype {data['dtype']} vs {model.dtype}")
    saved_optimizer = str(data.get("optimizer", "sgd"))  # format 1 held SGD's state only
    if saved_optimizer != optimizer.name:
        mismatch.append(f"optimizer {saved_optimizer} vs {optimizer.name}")
    for name, p in model.params.items():
        saved = data.get(f"param/{name}")
        if saved is None or saved.shape != p.shape:
            mismatch.append(f"{name}: {None if saved is None else saved.shape} vs {p.shape}")
    if mismatch:
        raise CheckpointError(f"{path} is for a different model: " + "; ".join(mismatch))
    xp = model.xp
    for name, p in model.params.items():
        p[...] = xp.asarray(data[f"param/{name}"])  # in place: views and references stay valid
    optimizer.load_state_dict({k[len("optim/"):]: v for k, v in data.items()
                               if k.startswith("optim/")}, xp=xp)
    return {k[len("state/"):]: v.item() for k, v in data.items() if k.startswith("state/")}
