"""Buffers that are neither NumPy arrays nor buffer-protocol objects: DLPack and CUDA arrays.

mpi4py takes, besides the buffer protocol, any object with ``__dlpack__`` or
``__cuda_array_interface__``; so does `mpidp.Comm`, through `as_array`:

    object                                   becomes
    __dlpack__, memory on the host           a NumPy array of that memory (`from_dlpack`)
    __dlpack__ on a GPU, or                  a CuPy array (`device_array`); without CuPy,
    __cuda_array_interface__                 an error that says CuPy is needed

A host DLPack object is consumed as mpi4py consumes it (its own
``MPI.buffer.frombuffer``), so mpidp writes where mpi4py writes and refuses what
mpi4py refuses (the read-only flag of a versioned capsule, non-contiguous memory).
"""

from __future__ import annotations

import ctypes

import numpy as np
from mpi4py import MPI


def as_array(obj, what: str, writable: bool):
    """An object with ``__dlpack__`` or ``__cuda_array_interface__`` as an array, no copy."""
    if hasattr(obj, "__cuda_array_interface__"):
        return device_array(obj, what)
    device_type, _ = obj.__dlpack_device__()
    if device_type in HOST_DEVICES:
        return from_dlpack(obj, writable)
    return device_array(obj, what)


# kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged: memory the CPU can address
HOST_DEVICES = (1, 3, 11, 13)


def from_dlpack(obj, writable: bool) -> np.ndarray:
    """A host DLPack object's memory as a flat NumPy array, no copy, as mpi4py reads it.

    mpi4py (``MPI.buffer.frombuffer``) takes the capsule and does the checks: it
    asks for a versioned capsule and falls back to an unversioned one, refuses a
    read-only one (the versioned flag) for writing with ``BufferError``, as well as
    a non-contiguous one. It does not consume the capsule: the capsule lives as long
    as the returned array (its base holds it), and the producer's capsule
    destructor calls the deleter, once. NumPy's ``from_dlpack`` would not do: it
    makes an unversioned capsule read-only, and consumes it (renames it, calls the
    deleter itself), which crashes producers that free the tensor with the capsule.
    """
    mem = MPI.buffer.frombuffer(obj, readonly=not writable)
    return np.frombuffer(mem, dtype=_dlpack_dtype(mem.obj))


class _DLTensor(ctypes.Structure):  # dlpack.h, DLTensor (up to the dtype)
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


# DLManagedTensorVersioned: version (2 x uint32), manager_ctx, deleter, flags (uint64),
# then the DLTensor; DLManagedTensor begins with it
_TENSOR_OFFSET = {b"dltensor_versioned": 32, b"dltensor": 0}
_DLPACK_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}  # kDLInt, kDLUInt, kDLFloat, ...


# our own prototypes: setting restype on ctypes.pythonapi's shared ones could clash
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _dlpack_dtype(capsule) -> np.dtype:
    """The element type that a DLPack capsule declares (raw bytes if NumPy has none)."""
    name = _capsule_name(capsule)
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, name) + _TENSOR_OFFSET[name])
    kind, size = _DLPACK_KINDS.get(tensor.code), (tensor.bits * tensor.lanes + 7) // 8
    if kind == "f" and tensor.lanes == 2:  # complex as two float lanes, as mpi4py reads it
        kind = "c"
    elif tensor.lanes != 1:
        kind = None
    try:
        return np.dtype(f"{kind}{size}") if kind else np.dtype(("V", size))
    except TypeError:  # a kind/size pair NumPy lacks (float8): raw bytes
        return np.dtype(("V", size))


def device_array(obj, what: str):
    """A GPU object (``__cuda_array_interface__`` or device DLPack) as a CuPy array."""
    try:
        import cupy
    except ImportError:
        raise ModuleNotFoundError(
            f"{what} is a GPU buffer ({type(obj).__name__}); mpidp.Comm works on GPU "
            "memory through CuPy, which is not installed: pip install cupy-cuda12x "
            "(or pass a host buffer)", name="cupy") from None
    if hasattr(obj, "__cuda_array_interface__"):
        return cupy.asarray(obj)
    return cupy.from_dlpack(obj)
