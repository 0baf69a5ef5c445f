"""Checkpoints: one ``.npz`` holding everything a bitwise-identical resume needs.

Contents (every entry a plain array, so loading never unpickles):

    format, sizes, activation, dtype      what model this is
    optimizer                             sgd, adam or adamw (format 2; format 1: sgd)
    param/W1, param/b1, ...               the parameters, by their stable names
    optim/steps, optim/velocity/W1, ...   the optimizer state (Adam: optim/exp_avg/W1,
                                          optim/exp_avg_sq/W1, ...), whole, by name
    state/epoch, state/step, ...          integers: where training stands, the data-order seed

The layout does not depend on the rank count or the ZeRO stage: a sharded run
saves ``ddp.full_optimizer()``, every rank's shard gathered, so a checkpoint of
any run loads into any other (`zero.py` takes each rank's shard on load).

Rank 0 writes it with `mpidp.files.replace`: a temporary file that mkstemp
creates beside the target (a random name, never through a planted link), fsynced,
renamed over the target, the folder fsynced. A crash leaves the old checkpoint or
the new one, never half of one, and a reader that has the old one open keeps it.
A path that is a symlink is resolved first: the file it points to is replaced
and the link stays. A target that is not a regular file (a device, a FIFO) is
refused, never replaced.

`load` checks the whole file before it changes anything: the format version,
every expected entry present and no other, each entry's shape and dtype, the
scalars. Each entry's size is checked from the zip directory and its ``.npy``
header before its data is decompressed, so a small file cannot make the loader
allocate a large array. Every problem, a truncated or corrupt file included
(the zip CRC catches flipped bits), is a `CheckpointError`.
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

from .. import files
from ..arrays import as_host

FORMAT = 2  # 2: the optimizer's name; format 1 files (SGD) still load
READABLE = (1, 2)
MAX_HEADER = 4096  # bytes; numpy writes 128-byte .npy headers for arrays like ours
MAX_SCALAR = 1024  # bytes of a whole entry holding a number, a name or the layer sizes


class CheckpointError(Exception):
    """The checkpoint cannot be used: missing, corrupt, truncated, or for another model."""


def save(path: str, model, optimizer, state: dict) -> None:
    """Write `path` atomically (through a symlink: its target, the link kept; a
    `files.WriteError` if it cannot be written, the old file kept).

    Args:
        state: integers such as epoch, step, seed, global_batch.
    """
    arrays = {"format": np.array(FORMAT), "sizes": np.array(model.sizes, dtype=np.int64),
              "activation": np.array(model.activation), "dtype": np.array(str(model.dtype)),
              "optimizer": np.array(optimizer.name)}
    arrays.update({f"param/{k}": as_host(p) for k, p in model.params.items()})
    arrays.update({f"optim/{k}": as_host(v) if hasattr(v, "dtype") else np.array(v)
                   for k, v in optimizer.state_dict().items()})
    arrays.update({f"state/{k}": np.array(v) for k, v in state.items()})
    files.replace(path, lambda f: np.savez(f, **arrays))


# ---------------------------------------------------------------- reading, checked


def _open(path: str) -> zipfile.ZipFile:
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({e})") from e


def _entries(z: zipfile.ZipFile, path: str) -> dict[str, zipfile.ZipInfo]:
    """Entry name (no ``.npy``) -> its zip member; nothing is decompressed."""
    entries = {}
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            raise CheckpointError(f"{path}: unexpected member {info.filename!r}")
        entries[info.filename[:-4]] = info
    return entries


def _header(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> tuple[tuple, np.dtype]:
    """An entry's shape and dtype from its .npy header, which is all that is decompressed."""
    name = info.filename[:-4]
    try:
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f, MAX_HEADER)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f, MAX_HEADER)
            else:
                raise ValueError(f".npy format {version}")
            header = f.tell()
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({name}: {e})") from e
    if dtype.hasobject:
        raise CheckpointError(f"{path}: {name} holds Python objects; a checkpoint holds "
                              "plain arrays only")
    if info.file_size != header + int(np.prod(shape)) * dtype.itemsize:
        raise CheckpointError(f"{path}: corrupt checkpoint ({name}: {info.file_size} bytes "
                              f"for a {dtype} array of shape {shape})")
    return shape, dtype


def _array(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> np.ndarray:
    """An entry's data, decompressed and CRC-checked (its header was checked already)."""
    try:
        with z.open(info) as f:
            a = np.lib.format.read_array(f, allow_pickle=False, max_header_size=MAX_HEADER)
            f.read(1)  # reach the end of the member: zipfile checks the CRC there
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint "
                              f"({info.filename[:-4]}: {e})") from e
    return a


def _check_format(z: zipfile.ZipFile, entries: dict, path: str) -> int:
    info = entries.get("format")
    if info is None or info.file_size > MAX_SCALAR:
        raise CheckpointError(f"{path}: not an mpidp checkpoint (no format entry)")
    shape, dtype = _header(z, info, path)
    version = _array(z, info, path)
    if shape != () or dtype.kind not in "iu" or int(version) not in READABLE:
        raise CheckpointError(f"{path}: checkpoint format {version.tolist()}; this mpidp "
                              f"reads formats {READABLE}")
    return int(version)


def read(path: str) -> dict:
    """Every array of the checkpoint, read and CRC-checked; CheckpointError if unreadable."""
    with _open(path) as z:
        entries = _entries(z, path)
        _check_format(z, entries, path)
        for info in entries.values():
            _header(z, info, path)
        return {name: _array(z, info, path) for name, info in entries.items()}


def _small(z: zipfile.ZipFile, entries: dict, name: str, path: str) -> np.ndarray | None:
    """A number, a name or the layer sizes: read at once, its size bounded first."""
    info = entries.get(name)
    if info is None:
        return None
    if info.file_size > MAX_SCALAR:
        raise CheckpointError(f"{path}: {name} has {info.file_size} bytes, at most "
                              f"{MAX_SCALAR} expected")
    shape, dtype = _header(z, info, path)
    if len(shape) > 1 or dtype.kind not in "iubU":
        raise CheckpointError(f"{path}: {name} is a {dtype} array of shape {shape}")
    return _array(z, info, path)


def _check_model(z: zipfile.ZipFile, entries: dict, path: str, model, optimizer,
                 version: int) -> None:
    """Layer sizes, activation, dtype and optimizer, compared before anything else is read."""
    names = ("sizes", "activation", "dtype", "optimizer")[:3 if version == 1 else 4]
    got = {k: _small(z, entries, k, path) for k in names}
    missing = [k for k, v in got.items() if v is None]
    if missing:
        raise CheckpointError(f"{path}: not a whole checkpoint ({', '.join(missing)} missing)")
    mismatch = []
    if got["sizes"].dtype.kind not in "iu" or got["sizes"].tolist() != list(model.sizes):
        mismatch.append(f"sizes {got['sizes'].tolist()} vs the model's {model.sizes}")
    if str(got["activation"]) != model.activation:
        mismatch.append(f"activation {got['activation']} vs {model.activation}")
    if str(got["dtype"]) != str(model.dtype):
        mismatch.append(f"dtype {got['dtype']} vs {model.dtype}")
    saved, mine = str(got.get("optimizer", "sgd")), getattr(optimizer, "name", "sgd")
    if saved != mine:  # format 1 held SGD's state only
        mismatch.append(f"optimizer {saved} vs {mine}")
    if mismatch:
        raise CheckpointError(f"{path} is for a different model: " + "; ".join(mismatch))


def _expected(entries: dict, model, optimizer, steps: int, state_keys) -> dict:
    """Entry -> a stand-in of its shape and dtype (the int 0: any integer scalar)."""
    expect = {f"param/{k}": p for k, p in model.params.items()}
    spec = getattr(optimizer, "state_spec", None)
    if spec is not None:  # the optimizer says what it holds after `steps` steps
        expect.update({f"optim/{k}": v for k, v in spec(steps).items()})
    else:  # it does not: a count, and arrays named after parameters, of their shapes
        expect["optim/steps"] = 0
        expect.update({k: model.params[k.rsplit("/", 1)[1]] for k in entries
                       if k.startswith("optim/") and k.rsplit("/", 1)[1] in model.params})
    if state_keys is None:
        state_keys = [k[len("state/"):] for k in entries if k.startswith("state/")]
    expect.update({f"state/{k}": 0 for k in state_keys})
    return expect


def _problem(name: str, shape: tuple, dtype: np.dtype, like) -> str | None:
    if isinstance(like, int):
        if shape == () and dtype.kind in "iub":
            return None
        return f"{name}: {dtype} of shape {shape}, expected an integer"
    if shape != tuple(like.shape) or dtype != like.dtype:
        return f"{name}: {dtype} of shape {shape}, expected {like.dtype} of shape {like.shape}"
    return None


def load(path: str, model, optimizer, state_keys=None) -> dict:
    """Restore the model and the optimizer from `path`; return the saved `state`.

    The whole file is checked first; on any problem, CheckpointError and nothing changed.

    Args:
        state_keys: the ``state/`` entries there must be (None: any, each an integer).
    """
    with _open(path) as z:
        entries = _entries(z, path)
        version = _check_format(z, entries, path)
        _check_model(z, entries, path, model, optimizer, version)
        steps = _small(z, entries, "optim/steps", path)  # what the optimizer holds depends on it
        steps = int(steps) if steps is not None and steps.shape == () else 0
        expect = _expected(entries, model, optimizer, steps, state_keys)
        checked = ("format", "sizes", "activation", "dtype", "optimizer")[:4 + (version > 1)]
        expect.update({k: None for k in checked})
        problems = [f"{k}: missing" for k in expect if k not in entries]
        problems += [f"{k}: not expected" for k in entries if k not in expect]
        for name in sorted(set(entries) & set(expect)):
            info, like = entries[name], expect[name]
            if like is None:
                continue
            most = MAX_SCALAR if isinstance(like, int) else (
                int(np.prod(like.shape)) * np.dtype(like.dtype).itemsize + MAX_HEADER)
            if info.file_size > most:  # refused before any of it is decompressed
                problems.append(f"{name}: {info.file_size} bytes, at most {most} expected")
            else:
                problems.append(_problem(name, *_header(z, info, path), like))
        problems = [p for p in problems if p]
        if problems:
            raise CheckpointError(f"{path} does not fit this model and optimizer: "
                                  + "; ".join(problems))
        data = {name: _array(z, info, path) for name, info in entries.items()}
    xp = model.xp
    for name, p in model.params.items():
        p[...] = xp.asarray(data[f"param/{name}"])  # in place: views and references stay valid
    optimizer.load_state_dict({k[len("optim/"):]: v for k, v in data.items()
                               if k.startswith("optim/")}, xp=xp)
    return {k[len("state/"):]: v.item() for k, v in data.items() if k.startswith("state/")}
