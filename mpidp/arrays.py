"""NumPy or CuPy: the array helpers every layer uses (algorithms, engine, training).

A device array is one with ``__cuda_array_interface__`` (CuPy's); anything else is
treated as a NumPy array. CuPy is imported only when a device array is seen.
"""

from __future__ import annotations

import numpy as np


def array_module(arr):
    """`numpy` for host arrays, `cupy` for device arrays."""
    if isinstance(arr, np.ndarray):
        return np
    if hasattr(arr, "__cuda_array_interface__"):
        import cupy

        return cupy
    return np


def flat(arr):
    """`arr` as a 1-D array: itself if it is one (a view costs more than the check)."""
    return arr if arr.ndim == 1 else arr.reshape(-1)


def is_device(arr) -> bool:
    return type(arr) is not np.ndarray and hasattr(arr, "__cuda_array_interface__")


def as_host(arr) -> np.ndarray:
    """`arr` itself if it is a NumPy array, else a host copy of it."""
    return arr if isinstance(arr, np.ndarray) else arr.get()
