"""Reading a checkpoint's ``.npz`` without trusting it: sizes first, data after, never a pickle.

Each member's size is checked from the zip directory and its ``.npy`` header
before its data is decompressed, so a small file cannot make the reader allocate
a large array; the data is then read whole, so that zipfile checks its CRC. Every
problem, a truncated or corrupt file included, is a `CheckpointError` naming the
file and the entry. `checkpoint.py` builds its checks on these.
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

MAX_HEADER = 4096  # bytes; numpy writes 128-byte .npy headers for arrays like ours
MAX_SCALAR = 1024  # bytes of a whole entry holding a number, a name or the layer sizes

# what zipfile and numpy raise on a damaged file (zipfile has no one exception for it)
# (NotImplementedError: a flag bit zipfile does not implement, in an entry's local header)
DAMAGED = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, NotImplementedError)
STORED_AS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # np.savez's, np.savez_compressed's


class CheckpointError(Exception):
    """The checkpoint cannot be used: missing, corrupt, truncated, or for another model."""


def open_zip(path: str) -> zipfile.ZipFile:
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        return zipfile.ZipFile(path)
    except DAMAGED as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({e})") from e


def members(z: zipfile.ZipFile, path: str) -> dict[str, zipfile.ZipInfo]:
    """Entry name (no ``.npy``) -> its zip member; nothing is decompressed."""
    entries = {}
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            raise CheckpointError(f"{path}: unexpected member {info.filename!r}")
        if info.flag_bits & 0x1 or info.compress_type not in STORED_AS:
            raise CheckpointError(f"{path}: corrupt checkpoint ({info.filename} is encrypted "
                                  f"or compressed as NumPy never writes)")
        entries[info.filename[:-4]] = info
    return entries


def header(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> tuple[tuple, np.dtype]:
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
            start = f.tell()  # where the data begins
    except DAMAGED as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({name}: {e})") from e
    if dtype.hasobject:
        raise CheckpointError(f"{path}: {name} holds Python objects; a checkpoint holds "
                              "plain arrays only")
    if info.file_size != start + int(np.prod(shape)) * dtype.itemsize:
        raise CheckpointError(f"{path}: corrupt checkpoint ({name}: {info.file_size} bytes "
                              f"for a {dtype} array of shape {shape})")
    return shape, dtype


def array(z: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> np.ndarray:
    """An entry's data, decompressed and CRC-checked (its header was checked already)."""
    try:
        with z.open(info) as f:
            a = np.lib.format.read_array(f, allow_pickle=False, max_header_size=MAX_HEADER)
            f.read(1)  # reach the end of the member: zipfile checks the CRC there
    except DAMAGED as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint "
                              f"({info.filename[:-4]}: {e})") from e
    return a


def small(z: zipfile.ZipFile, entries: dict, name: str, path: str) -> np.ndarray | None:
    """A number, a name or the layer sizes: read at once, its size bounded first."""
    info = entries.get(name)
    if info is None:
        return None
    if info.file_size > MAX_SCALAR:
        raise CheckpointError(f"{path}: {name} has {info.file_size} bytes, at most "
                              f"{MAX_SCALAR} expected")
    shape, dtype = header(z, info, path)
    if len(shape) > 1 or dtype.kind not in "iubU":
        raise CheckpointError(f"{path}: {name} is a {dtype} array of shape {shape}")
    return array(z, info, path)
