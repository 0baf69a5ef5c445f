"""Staging: what is handed to MPI, host staging of device buffers, the scratch pool.

MPI moves bytes; the reductions need typed arrays. Every message is therefore
sent as ``[array, MPI.BYTE]``: the dtype never has to be known to MPI (float16,
bool and complex travel the same way) and a CUDA-aware MPI gets the device
pointer of a CuPy array through ``__cuda_array_interface__``.

GPU arrays and MPI:

- Stream safety: a CuPy reduction is queued on the current stream and may not
  have run when MPI reads the buffer, so the driver calls `sync` before it hands
  a round's device buffers to MPI (mpi4py cannot do this for us).
- CUDA-awareness is detected once per process (`cuda_aware`): the
  ``MPIDP_CUDA_AWARE=0|1`` override, else ``MPIX_Query_cuda_support`` (Open MPI,
  MPICH) or ``MPIX_GPU_query_support`` (MPICH) looked up with ctypes in the loaded
  MPI library; mpi4py 4 wraps neither. The MPI wheels on PyPI are not CUDA-aware.
- Where MPI is not CUDA-aware, device blocks are staged (`Stager`): copied to a
  pinned host buffer before sending, received into one and copied back after.
  ``MPIDP_STAGING=1`` stages every buffer, NumPy ones too, so that this path runs
  and is tested on machines without a GPU.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ... import config
from ...arrays import array_module, is_device


def msg(arr):
    """The buffer spec for one message: the array's bytes."""
    return [arr, MPI.BYTE]


def sync(arr) -> None:
    """Make pending GPU work on `arr` visible to MPI (mpi4py cannot do it for us)."""
    if is_device(arr):
        import cupy

        cupy.cuda.get_current_stream().synchronize()


# ---------------------------------------------------------------- CUDA-awareness

_cuda_aware: bool | None = None


def cuda_aware() -> bool:
    """Can the MPI library take device pointers? Detected once per process."""
    global _cuda_aware
    if _cuda_aware is None:
        told = config.get("MPIDP_CUDA_AWARE")  # True, False, or None: ask the library
        _cuda_aware = told if told is not None else _detect_cuda_aware(None, _mpi_library())
    return _cuda_aware


def _detect_cuda_aware(override: str | None, library: str | None) -> bool:
    """The override if set ("0"/"1"), else ask the MPI library; False if it cannot say."""
    told = config.parse("MPIDP_CUDA_AWARE", override or "")
    if told is not None:
        return told
    if library is None:
        return False
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return False
    if hasattr(lib, "MPIX_Query_cuda_support"):  # Open MPI, MPICH >= 4
        lib.MPIX_Query_cuda_support.restype = ctypes.c_int
        return bool(lib.MPIX_Query_cuda_support())
    if hasattr(lib, "MPIX_GPU_query_support"):  # MPICH: (MPIX_GPU_SUPPORT_CUDA=0, &flag)
        flag = ctypes.c_int(0)
        ok = lib.MPIX_GPU_query_support(0, ctypes.byref(flag)) == 0
        return ok and bool(flag.value)
    return False


def _mpi_library() -> str | None:
    """Path of the MPI library this process loaded (through mpi4py)."""
    try:
        with open("/proc/self/maps") as maps:
            found = re.findall(r"(/\S*lib(?:mpi|msmpi)[^/\s]*\.so[.\d]*)", maps.read())
    except OSError:
        return None
    return found[0] if found else None


# ---------------------------------------------------------------- host staging

_staging: str | None = None  # MPIDP_STAGING's mode, read at first use: environ costs ~1 µs


def staging_mode() -> str:
    """'all' (MPIDP_STAGING=1), 'off' (MPIDP_STAGING=0) or 'auto' (device arrays,
    where MPI is not CUDA-aware). The variable is read at the first use, then kept;
    `set_staging` changes the mode at run time."""
    global _staging
    if _staging is None:
        _staging = config.get("MPIDP_STAGING")
    return _staging


def set_staging(value: str) -> None:
    """Set the staging mode as MPIDP_STAGING would: "1", "0" or "" (auto)."""
    global _staging
    _staging = config.parse("MPIDP_STAGING", value)


def needs_staging(arr, mode: str) -> bool:
    if mode == "all":
        return True
    return mode == "auto" and is_device(arr) and not cuda_aware()


def host_buffer(like):
    """A host array for staging `like`: pinned memory for a device array."""
    if is_device(like):
        import cupy

        mem = cupy.cuda.alloc_pinned_memory(like.nbytes)
        return np.frombuffer(mem, dtype=like.dtype, count=like.size)
    return np.empty(like.size, dtype=like.dtype)


def to_host(src, host) -> None:
    if is_device(src):
        src.get(out=host)
    else:
        np.copyto(host, src)


def from_host(host, dst) -> None:
    if is_device(dst):
        dst.set(host)
    else:
        np.copyto(dst, host)


class Staged(NamedTuple):
    """A round ready for MPI: the messages to post, and the copies around them."""

    round: list
    fill: Callable[[], None] | None = None  # copy staged sends out (after receives are up)
    finish: Callable[[], None] | None = None  # copy staged receives back (round complete)


class Stager:
    """Prepares each round of a collective on device buffers (or every buffer) for MPI.

    Device buffers: wait for the current CUDA stream first (MPI must not read a
    block that a queued reduction is still writing); this is the only place mpidp
    synchronizes. Where MPI cannot take device pointers (or MPIDP_STAGING=1), each
    buffer is swapped for a host buffer from the communicator's pool: `fill` copies
    the sends out, and the engine calls it only once the receives are posted, so
    incoming data flows while the sends are copied; `finish` copies the receives
    back once the round is done.
    """

    __slots__ = ("mode", "pool")

    def __init__(self, mode: str, pool: ScratchPool):
        self.mode, self.pool = mode, pool

    def __call__(self, round_: list) -> Staged:
        device = [m.buf for m in round_ if is_device(m.buf)]
        if device:
            sync(device[0])
        if not any(needs_staging(m.buf, self.mode) for m in round_):
            return Staged(round_)
        wire, out, back, held = [], [], [], []
        for m in round_:
            if not needs_staging(m.buf, self.mode):
                wire.append(m)
                continue
            host = self.pool.take_host(m.buf)
            held.append(host)
            wire.append(m._replace(buf=host))  # the same message, through host memory
            (out if m.outgoing else back).append((m.buf, host))  # (user's buffer, host)

        def fill() -> None:
            for src, host in out:
                to_host(src, host)

        def finish() -> None:
            for dst, host in back:
                from_host(host, dst)
            for host in held:
                self.pool.give(host)

        return Staged(wire, fill, finish)


def stager(buf, pool: ScratchPool) -> Stager | None:
    """What a collective on `buf` needs, decided once per call: None for NumPy buffers
    (nothing to sync or stage: the common case), else a `Stager`."""
    mode = _staging or staging_mode()  # (the mode as kept, without a call: every call's path)
    if mode != "all" and type(buf) is np.ndarray:
        return None
    return Stager(mode, pool)


class ScratchPool:
    """Free lists of scratch arrays keyed by (module, device, dtype, count).

    A collective takes a buffer at its start and gives it back when it completes,
    so calls of the same size reuse one buffer, and collectives in flight at the
    same time (the trainer's buckets) each get their own.

    A progress thread may complete collectives, so two threads may use a pool at
    once. Every step is one operation on a dict or a list (``get``, ``setdefault``,
    ``pop``, ``append``), each atomic in CPython, so no lock is needed: at worst a
    race allocates one buffer more, or keeps one more than `keep`.
    """

    def __init__(self, keep: int = 4):
        self.keep = keep  # free buffers kept per key
        self._free: dict[tuple, list] = {}
        self._host_keys: dict[int, tuple] = {}  # staging buffers, by id

    def take(self, like, count: int):
        """A 1-D scratch array of `count` items of like's dtype, on like's device."""
        free = self._free.get((like.dtype, count) if type(like) is np.ndarray
                              else _key(like, count))
        if free:
            try:
                return free.pop()
            except IndexError:  # another thread took the last one meanwhile
                pass
        return array_module(like).empty(count, dtype=like.dtype)

    def take_host(self, like):
        """A host array to stage `like` through (pinned memory if `like` is on a GPU)."""
        key = ("host", is_device(like), like.dtype.str, like.size)
        free = self._free.get(key)
        try:
            host = free.pop() if free else host_buffer(like)
        except IndexError:
            host = host_buffer(like)
        self._host_keys[id(host)] = key  # how `give` files it back
        return host

    def give(self, arr) -> None:
        key = self._host_keys and self._host_keys.pop(id(arr), None)
        if not key:
            key = (arr.dtype, arr.size) if type(arr) is np.ndarray else _key(arr, arr.size)
        free = self._free.get(key)
        if free is None:
            free = self._free.setdefault(key, [])
        if len(free) < self.keep:
            free.append(arr)

    def clear(self) -> None:
        self._free.clear()

    def nbytes(self) -> int:
        """Bytes held in free lists."""
        return sum(a.nbytes for free in list(self._free.values()) for a in list(free))


def _key(arr, count: int) -> tuple:
    """Pool key: (dtype, count) for host arrays; plus the device for GPU arrays."""
    if type(arr) is np.ndarray:
        return (arr.dtype, count)
    dev = getattr(arr, "device", None)
    dev = getattr(dev, "id", None) if dev is not None and not isinstance(dev, str) else None
    return (arr.dtype, count, array_module(arr).__name__, dev)
