"""Buffers: NumPy/CuPy dispatch, what is handed to MPI, and the scratch pool.

MPI moves bytes; the reductions need typed arrays. Every message is therefore
sent as ``[array, MPI.BYTE]``: the dtype never has to be known to MPI (float16,
bool and complex travel the same way) and a CUDA-aware MPI gets the device
pointer of a CuPy array through ``__cuda_array_interface__``.
"""

from __future__ import annotations

import threading

import numpy as np
from mpi4py import MPI


def array_module(arr):
    """`numpy` for host arrays, `cupy` for device arrays."""
    if isinstance(arr, np.ndarray):
        return np
    if hasattr(arr, "__cuda_array_interface__"):
        import cupy

        return cupy
    return np


def msg(arr):
    """The buffer spec for one message: the array's bytes."""
    return [arr, MPI.BYTE]


def sync(arr) -> None:
    """Make pending GPU work on `arr` visible to MPI (mpi4py cannot do it for us)."""
    if not isinstance(arr, np.ndarray) and hasattr(arr, "__cuda_array_interface__"):
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def check_buffer(arr, what: str, writable: bool = False) -> None:
    """Raise if `arr` is not a contiguous array (writable if asked)."""
    if not hasattr(arr, "dtype") or not hasattr(arr, "flags"):
        raise TypeError(f"{what} must be a NumPy or CuPy array, not {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (got strides {arr.strides})")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only; the result cannot be written into it")


class ScratchPool:
    """Free lists of scratch arrays keyed by (module, device, dtype, count).

    A collective takes a buffer at its start and gives it back when it completes,
    so calls of the same size reuse one buffer, and collectives in flight at the
    same time (the trainer's buckets) each get their own.
    """

    def __init__(self, keep: int = 4):
        self.keep = keep  # free buffers kept per key
        self._free: dict[tuple, list] = {}
        self._lock = threading.Lock()  # a progress thread may complete collectives

    def take(self, like, count: int):
        """A 1-D scratch array of `count` items of like's dtype, on like's device."""
        xp = array_module(like)
        key = (xp.__name__, _device(like), like.dtype.str, count)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return xp.empty(count, dtype=like.dtype)

    def give(self, arr) -> None:
        xp = array_module(arr)
        key = (xp.__name__, _device(arr), arr.dtype.str, arr.size)
        with self._lock:
            free = self._free.setdefault(key, [])
            if len(free) < self.keep:
                free.append(arr)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()

    def nbytes(self) -> int:
        """Bytes held in free lists."""
        with self._lock:
            return sum(a.nbytes for free in self._free.values() for a in free)


def _device(arr):
    dev = getattr(arr, "device", None)
    return getattr(dev, "id", None) if dev is not None and not isinstance(dev, str) else None
