"""A CPU DLPack producer written with ctypes, as a user's library would write one.

`Exported(array)` shows `array`'s memory through ``__dlpack__`` and
``__dlpack_device__`` only: no buffer protocol. Options:

- ``versioned=False``: a DLPack 0.x producer, whose ``__dlpack__`` knows no
  ``max_version`` and hands out a "dltensor" capsule (which has no read-only flag);
- ``tied=True``: the tensor struct is freed with its capsule, as mpi4py's own test
  producer (test/dlpackimpl.py) does. A consumer that keeps the capsule, as mpi4py
  does, is fine; one that renames it and calls the deleter later, as NumPy's
  ``from_dlpack``, calls into freed memory (the crash of issue 15).

Every export is counted, and so is every deleter call; a second call for the same
export is counted in `double_deletes`, so a test can check that each capsule is
deleted exactly once, and not while the consumer still uses the memory.

Only for calls that succeed: the capsule destructor is Python code run through
ctypes, which cannot run while an exception is on its way out of the consumer
(ctypes fails on the pending one; NumPy's C destructor saves and restores it). The
refusals are tested with NumPy's own producer behind a wrapper (`NumpyProducer`).
"""

from __future__ import annotations

import ctypes

import numpy as np


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Managed(ctypes.Structure):  # DLManagedTensor
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class ManagedVersioned(ctypes.Structure):  # DLManagedTensorVersioned (DLPack 1.0)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool

# Raw pointers, not py_object: a capsule destructor runs at refcount 0 and must not touch it.
_api = ctypes.pythonapi
DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, DESTRUCTOR)(
    ("PyCapsule_New", _api))
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))

_live: dict[int, tuple] = {}  # struct address -> (struct, its Exported, shape): alive until deleted
_tied: dict[int, int] = {}  # capsule address -> struct address, for tied producers


@DELETER
def _deleter(address):
    entry = _live.pop(address, None)
    if entry is None:  # deleted before: a consumer called the deleter twice
        Exported.double_deletes += 1
        return
    entry[1].deleted += 1


@DESTRUCTOR
def _destructor(capsule):
    for name, kind in ((b"dltensor_versioned", ManagedVersioned), (b"dltensor", Managed)):
        if _is_valid(capsule, name):  # not consumed: the producer deletes it
            managed = kind.from_address(_pointer(capsule, name))
            managed.deleter(ctypes.addressof(managed))
            break
    address = _tied.pop(capsule, None)
    if address is not None:  # tied: the struct goes with the capsule, consumed or not
        _live.pop(address, None)


class Exported:
    """A NumPy array's memory behind ``__dlpack__`` alone (see the module docstring)."""

    double_deletes = 0  # over all producers

    def __init__(self, array: np.ndarray, versioned: bool = True, tied: bool = False):
        self.array, self.versioned, self.tied = array, versioned, tied
        self.exported = self.deleted = 0

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    def __dlpack__(self, stream=None, **kwargs):
        if not self.versioned and kwargs:  # a 0.x producer knows none of the 1.0 keywords
            raise TypeError(f"__dlpack__() got unexpected keyword arguments {sorted(kwargs)}")
        use_versioned = self.versioned and kwargs.get("max_version", (0, 0)) >= (1, 0)
        managed = ManagedVersioned() if use_versioned else Managed()
        a = self.array
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        t = managed.dl_tensor
        t.data, t.device_type, t.ndim = a.ctypes.data, 1, a.ndim
        t.code, t.bits, t.lanes = CODES[a.dtype.kind], a.dtype.itemsize * 8, 1
        t.shape = shape
        t.strides = (ctypes.c_int64 * max(a.ndim, 1))(*(s // a.itemsize for s in a.strides))
        managed.deleter = _deleter
        if use_versioned:
            managed.major = 1
        address = ctypes.addressof(managed)
        _live[address] = (managed, self, shape, t.strides)
        self.exported += 1
        capsule = _new(address, b"dltensor_versioned" if use_versioned else b"dltensor",
                       _destructor)
        if self.tied:
            _tied[id(capsule)] = address
        return capsule

    @property
    def live(self) -> int:
        """Exports whose deleter has not run yet."""
        return self.exported - self.deleted


class NumpyProducer:
    """NumPy's own DLPack producer, with the buffer protocol hidden (read-only flag and all)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()
