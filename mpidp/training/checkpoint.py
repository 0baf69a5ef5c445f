"""Checkpoints: one ``.npz`` holding everything a bitwise-identical resume needs.

Contents (every entry a plain array, so loading never unpickles):

    format, sizes, activation, dtype      what model this is
    optimizer                             sgd, adam or adamw (format 2; format 1: sgd)
    param/W1, param/b1, ...               the parameters, by their stable names
    optim/steps, optim/velocity/W1, ...   the optimizer state (Adam: optim/exp_avg/W1,
                                          optim/exp_avg_sq/W1, ...), whole, by name
    state/epoch, state/step               integers: where training stands (format 2: also
                                          seed, global_batch, accum_steps)
    settings                              JSON text (format 3): every setting that changes
                                          what the run computes (the trainer's choice)

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
every expected entry present and no other, each entry's shape and dtype (from
the zip directory and the ``.npy`` headers, before any data is decompressed:
`npz.py`), the scalars (every integer in range, through `mpidp.untrusted`), and
the recorded settings against the run's (each one that differs is named). Every
problem, a truncated or corrupt file included (the zip CRC catches flipped
bits), is a `CheckpointError`.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np

from .. import files, untrusted
from ..arrays import as_host
from .npz import MAX_HEADER, MAX_SCALAR, CheckpointError, array, header, members, open_zip, small

FORMAT = 3  # 3: the run's settings; 2: the optimizer's name; 1: SGD. All three load
READABLE = (1, 2, 3)
LEGACY = ("seed", "global_batch", "accum_steps")  # the settings format 2 kept in state/
MAX_SETTINGS = 1 << 16  # bytes of the settings entry (JSON text, 4 bytes a character)
COUNT = untrusted.Int(0, 1 << 53)  # a state integer or the optimizer's step count
SETTING = untrusted.Either((untrusted.Null(), untrusted.Bool(), untrusted.Int(),
                            untrusted.Num(finite=False), untrusted.Text(256),
                            untrusted.List(untrusted.Int(), max_len=64)))


def save(path: str, model, optimizer, state: dict, settings: dict | None = None) -> None:
    """Write `path` atomically (through a symlink: its target, the link kept; a
    `files.WriteError` if it cannot be written, the old file kept).

    Args:
        state: integers such as epoch and step.
        settings: names -> numbers, strings, booleans, None or lists of integers: what
            `load` compares with the resuming run's.
    """
    arrays = {"format": np.array(FORMAT), "sizes": np.array(model.sizes, dtype=np.int64),
              "activation": np.array(model.activation), "dtype": np.array(str(model.dtype)),
              "optimizer": np.array(optimizer.name)}
    arrays.update({f"param/{k}": as_host(p) for k, p in model.params.items()})
    arrays.update({f"optim/{k}": as_host(v) if hasattr(v, "dtype") else np.array(v)
                   for k, v in optimizer.state_dict().items()})
    arrays.update({f"state/{k}": np.array(v) for k, v in state.items()})
    arrays["settings"] = np.array(json.dumps(settings or {}, sort_keys=True))
    files.replace(path, lambda f: np.savez(f, **arrays))


# ---------------------------------------------------------------- reading, checked


def _shown(value) -> str:
    """A value read from the file, for a message of one line: as it prints, or its repr
    where that holds a newline or another character that does not print (cut at 60)."""
    text = str(value.tolist() if hasattr(value, "tolist") else value)
    return text if text.isprintable() and len(text) <= 60 else untrusted._show(text)


def _check_format(z: zipfile.ZipFile, entries: dict, path: str) -> int:
    info = entries.get("format")
    if info is None or info.file_size > MAX_SCALAR:
        raise CheckpointError(f"{path}: not an mpidp checkpoint (no format entry)")
    shape, dtype = header(z, info, path)
    version = array(z, info, path)
    if shape != () or dtype.kind not in "iu" or int(version) not in READABLE:
        raise CheckpointError(f"{path}: checkpoint format {_shown(version)}; this mpidp "
                              f"reads formats {READABLE}")
    return int(version)


def read(path: str) -> dict:
    """Every array of the checkpoint, read and CRC-checked; CheckpointError if unreadable."""
    with open_zip(path) as z:
        entries = members(z, path)
        _check_format(z, entries, path)
        for info in entries.values():
            header(z, info, path)
        return {name: array(z, info, path) for name, info in entries.items()}


def _check_model(z: zipfile.ZipFile, entries: dict, path: str, model, optimizer,
                 version: int) -> None:
    """Layer sizes, activation, dtype and optimizer, compared before anything else is read."""
    names = ("sizes", "activation", "dtype", "optimizer")[:3 if version == 1 else 4]
    got = {k: small(z, entries, k, path) for k in names}
    missing = [k for k, v in got.items() if v is None]
    if missing:
        raise CheckpointError(f"{path}: not a whole checkpoint ({', '.join(missing)} missing)")
    mismatch = []
    if got["sizes"].dtype.kind not in "iu" or got["sizes"].tolist() != list(model.sizes):
        mismatch.append(f"sizes {_shown(got['sizes'])} vs the model's {model.sizes}")
    if str(got["activation"]) != model.activation:
        mismatch.append(f"activation {_shown(got['activation'])} vs {model.activation}")
    if str(got["dtype"]) != str(model.dtype):
        mismatch.append(f"dtype {_shown(got['dtype'])} vs {model.dtype}")
    saved, mine = str(got.get("optimizer", "sgd")), getattr(optimizer, "name", "sgd")
    if saved != mine:  # format 1 held SGD's state only
        mismatch.append(f"optimizer {_shown(saved)} vs {mine}")
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


def version(path: str) -> int:
    """The checkpoint's format (CheckpointError if it is not a readable checkpoint)."""
    with open_zip(path) as z:
        return _check_format(z, members(z, path), path)


def _checked(value, schema, name: str, path: str):
    try:
        return untrusted.check(value, schema, name)
    except untrusted.InputError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _settings(z: zipfile.ZipFile, info: zipfile.ZipInfo | None, path: str) -> dict:
    """The recorded settings (format 3): JSON text, its size and every value checked."""
    if info is None or info.file_size > MAX_SETTINGS:
        raise CheckpointError(f"{path}: settings missing or over {MAX_SETTINGS} bytes")
    shape, dtype = header(z, info, path)
    if shape != () or dtype.kind != "U":
        raise CheckpointError(f"{path}: settings: {dtype} of shape {shape}, expected text")
    try:
        value = untrusted.parse_json(str(array(z, info, path)), "settings")
    except untrusted.InputError as e:
        raise CheckpointError(f"{path}: {e}") from None
    value = _checked(value, untrusted.Record(), "settings", path)
    return {k: _checked(v, SETTING, f"settings.{k}", path) for k, v in value.items()}


def _differences(path: str, recorded: dict, settings: dict, version: int) -> None:
    """CheckpointError naming each of the run's `settings` that the file records otherwise."""
    mine = json.loads(json.dumps(settings))  # tuples as lists, as the file holds them
    differ = [f"{k}={recorded[k]!r}, this run has {v!r}" if k in recorded else
              f"{k} not recorded" for k, v in mine.items()
              if (k in recorded or version >= 3) and recorded.get(k) != v]
    if differ:
        raise CheckpointError(f"{path} was written with " + "; ".join(differ)
                              + ": resuming would not continue that run")


def load(path: str, model, optimizer, state_keys=None, settings: dict | None = None,
         check=None) -> dict:
    """Restore the model and the optimizer from `path`; return the saved `state`.

    The whole file is checked first; on any problem, CheckpointError and nothing changed.

    Args:
        state_keys: the ``state/`` entries there must be (None: any, each an integer).
        settings: the run's settings, compared with the recorded ones (format 2 records
            only `LEGACY`'s, in state/: those are compared, the others cannot be).
        check: called as ``check(state, optimizer_steps)`` before anything changes; a
            CheckpointError it raises leaves the model and optimizer as they were.
    """
    with open_zip(path) as z:
        entries = members(z, path)
        version = _check_format(z, entries, path)
        _check_model(z, entries, path, model, optimizer, version)
        steps = small(z, entries, "optim/steps", path)  # what the optimizer holds depends on it
        steps = _checked(steps.item(), COUNT, "optim/steps", path) \
            if steps is not None and steps.shape == () else 0
        if version < 3 and settings is not None and state_keys is not None:
            state_keys = [*state_keys, *(k for k in LEGACY if f"state/{k}" in entries)]
        expect = _expected(entries, model, optimizer, steps, state_keys)
        checked = ("format", "sizes", "activation", "dtype", "optimizer",
                   "settings")[:4 + (version > 1) + (version > 2)]
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
                problems.append(_problem(name, *header(z, info, path), like))
        problems = [p for p in problems if p]
        if problems:
            raise CheckpointError(f"{path} does not fit this model and optimizer: "
                                  + "; ".join(problems))
        recorded = _settings(z, entries.get("settings"), path) if version > 2 else {}
        data = {name: array(z, info, path) for name, info in entries.items()
                if name != "settings"}
    state = {k[len("state/"):]: _checked(v.item(), COUNT, k, path)
             for k, v in data.items() if k.startswith("state/")}
    if settings is not None:
        if version < 3:
            recorded = {k: state[k] for k in LEGACY if k in state}
        _differences(path, recorded, settings, version)
    if check is not None:
        check(state, steps)
    xp = model.xp
    for name, p in model.params.items():
        p[...] = xp.asarray(data[f"param/{name}"])  # in place: views and references stay valid
    optimizer.load_state_dict({k[len("optim/"):]: v for k, v in data.items()
                               if k.startswith("optim/")}, xp=xp)
    return state
