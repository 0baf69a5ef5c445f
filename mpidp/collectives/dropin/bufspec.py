"""Buffer specs: mpi4py's ways of naming a message, parsed into typed 1-D views.

``mpidp.Comm`` takes the buffer arguments that mpi4py takes, with mpi4py's rules
(``message_simple`` and ``message_vector`` in mpi4py's msgbuffer.pxi)::

    buf                         all of buf, as its own dtype
    [buf, type]                 all of buf, as items of the MPI datatype
    [buf, count, type]          the first count items
    [buf, (count, displ), type] count items from item displ
    [buf, count, displ, type]   the same
    [buf, counts, displs, type] one block per rank (vector: Allgatherv)

and turns each into a contiguous 1-D NumPy or CuPy view of the user's memory, no
copy, so that the result of a collective lands in the user's buffer. Any object
with the buffer protocol, ``__cuda_array_interface__`` or ``__dlpack__`` is a
buffer (`interop`); a datatype is a predefined ``MPI.Datatype`` or its type code
("i", "d"). A send buffer of ``None`` is ``MPI.IN_PLACE`` (`in_place`), as in
mpi4py; ``None`` inside a spec is an empty buffer (``[None, MPI.INT]``).
Errors are mpi4py's: ``ValueError`` for counts and displacements, ``TypeError``
and ``BufferError`` for buffers, ``NotImplementedError`` for derived datatypes.
"""

from __future__ import annotations

import operator

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import interop

_KINDS = "biufcS"  # booleans, integers, floats, complex, bytes: what the ops and copies handle


def in_place(sendbuf) -> bool:
    """mpi4py's test for an in-place send buffer: ``MPI.IN_PLACE`` or ``None``."""
    return sendbuf is None or sendbuf is MPI.IN_PLACE


def simple(spec, what: str, blocks: int = 0, writable: bool = False):
    """Parse a buffer spec as mpi4py's ``message_simple``: return (view, count).

    The view holds ``count * max(blocks, 1)`` items from the displacement on. With
    ``blocks >= 2`` (Allgather's recvbuf) ``count`` is per block; if the spec gives
    no count, the buffer must divide into the blocks.
    """
    buf, count, displ, datatype = _unpack(spec, vector=False)
    data = _typed(buf, datatype, what, writable)
    if count is None and displ is None and blocks < 2:  # all of it (the common case)
        return data, data.size
    displ = 0 if displ is None else operator.index(displ)
    if displ < 0:
        raise ValueError(f"message: negative displacement {displ}")
    if displ > data.size:
        raise ValueError(f"message: displacement {displ} out of bounds, "
                         f"number of datatype entries {data.size}")
    left = data.size - displ
    if count is None:
        if blocks >= 2 and left % blocks:
            raise ValueError(f"message: cannot infer count, number of entries {left} "
                             f"is not a multiple of required number of blocks {blocks}")
        count = left // max(blocks, 1)
    count = operator.index(count)
    if count < 0:
        raise ValueError(f"message: negative count {count}")
    items = count * max(blocks, 1)
    if items > left:
        raise ValueError(f"{what}: {items} items from displacement {displ} do not fit "
                         f"in a buffer of {data.size}")
    return data[displ : displ + items], count


def vector(spec, what: str, n: int):
    """Parse a buffer spec as mpi4py's ``message_vector``: return (view, counts, displs)."""
    buf, counts, displs, datatype = _unpack(spec, vector=True)
    data = _typed(buf, datatype, what, writable=True)
    if counts is None:  # as mpi4py: split the buffer as evenly as possible
        base, extra = divmod(data.size, n)
        counts = [base + (i < extra) for i in range(n)]
    elif isinstance(counts, (int, np.integer)):
        counts = [int(counts)] * n
    else:
        counts = [operator.index(c) for c in counts]
    if len(counts) != n:
        raise ValueError(f"expecting {n} counts, got {len(counts)}")
    if displs is None:  # packed
        displs = [sum(counts[:i]) for i in range(n)]
    elif isinstance(displs, (int, np.integer)):  # strided
        displs = [int(displs) * i for i in range(n)]
    else:
        displs = [operator.index(d) for d in displs]
    if len(displs) != n:
        raise ValueError(f"expecting {n} displs, got {len(displs)}")
    return data, counts, displs


def _unpack(spec, vector: bool):
    """Split a spec into (buf, count, displ, datatype), any of the last three None."""
    if spec is None:  # a sendbuf of None is IN_PLACE, caught before; elsewhere not a buffer
        raise TypeError("message: expecting buffer or list/tuple")
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    # simple messages take (count, displ) as a tuple or a list; vector ones as a tuple
    pair = tuple if vector else (tuple, list)
    count = displ = datatype = None
    if len(spec) == 2:
        buf, count = spec
        if isinstance(count, (MPI.Datatype, str)):
            count, datatype = None, count
        elif isinstance(count, pair):
            count, displ = count
    elif len(spec) == 3:
        buf, count, datatype = spec
        if isinstance(count, pair):
            count, displ = count
    elif len(spec) == 4:
        buf, count, displ, datatype = spec
    else:
        raise ValueError("message: expecting 2 to 4 items")
    return buf, count, displ, datatype


def _typed(buf, datatype, what: str, writable: bool):
    """All of `buf` as a 1-D array of `datatype`'s items (buf's own dtype if None), no copy."""
    if buf is None:  # [None, type]: no data, as mpi4py's MPI_BOTTOM message
        if datatype is None:
            raise KeyError("cannot map None to MPI datatype")
        return np.empty(0, dtype=_to_dtype(datatype, what))
    arr = _as_array(buf, what, writable)
    if writable and not getattr(arr.flags, "writeable", True):  # CuPy has no such flag
        raise BufferError(f"{what} is not writable")
    if datatype is None:
        dtype = arr.dtype
        if not dtype.isnative:  # mpi4py's errors, word for word
            raise BufferError(f"format string {_format(arr)!r} with non-native byte order")
        if dtype.kind not in _KINDS:  # objects (their bytes are pointers), str, records
            raise KeyError(f"cannot map {_format(arr)!r} to MPI datatype")
        return arr
    dtype = _to_dtype(datatype, what)
    if arr.dtype == dtype:
        return arr
    if arr.nbytes % dtype.itemsize:
        raise ValueError(f"message: cannot infer count, buffer length {arr.nbytes} is not "
                         f"a multiple of datatype extent {dtype.itemsize}")
    return arr.view("u1").view(dtype)  # reinterpret the bytes, as MPI does


def _format(arr) -> str:
    """The buffer-protocol format of `arr` (what mpi4py names in its error), else its dtype."""
    try:
        return memoryview(arr).format
    except (TypeError, ValueError):
        return arr.dtype.str


def _as_array(buf, what: str, writable: bool):
    """The memory of `buf` as a contiguous 1-D NumPy (host) or CuPy (device) array, no copy."""
    if type(buf) is np.ndarray:
        arr = buf
    elif isinstance(buf, np.ndarray):
        arr = np.asarray(buf)  # a subclass: as a plain array
    elif hasattr(buf, "__cuda_array_interface__"):
        arr = interop.as_array(buf, what, writable)
    else:
        try:
            view = memoryview(buf)  # bytearray, array.array, memoryview, ...
        except TypeError:
            if not hasattr(buf, "__dlpack__"):
                raise TypeError(f"{what}: expecting a buffer or a list/tuple, "
                                f"not {type(buf).__name__}") from None
            arr = interop.as_array(buf, what, writable)
        else:
            if not view.contiguous:
                raise BufferError(f"{what}: buffer is not contiguous")
            try:
                arr = np.asarray(view)
            except (ValueError, TypeError, NotImplementedError):  # a format NumPy cannot read
                arr = np.frombuffer(view.cast("B") if view.ndim != 1 else view, dtype=np.uint8)
    if arr.flags.c_contiguous:
        return arr if arr.ndim == 1 else arr.reshape(-1)
    if arr.flags.f_contiguous:
        return arr.reshape(-1, order="F")  # memory order: what MPI would send
    raise BufferError(f"{what}: buffer is not contiguous (strides {arr.strides})")


def _resolve(datatype, what: str) -> MPI.Datatype:
    """The predefined MPI datatype a spec names: a type code's, a duplicate's base type."""
    if isinstance(datatype, str):
        try:
            datatype = MPI.Datatype.fromcode(datatype)
        except (KeyError, ValueError):
            raise KeyError(f"cannot map {datatype!r} to MPI datatype") from None
    if not isinstance(datatype, MPI.Datatype):
        raise TypeError(f"{what}: expecting an MPI.Datatype, not {type(datatype).__name__}")
    if datatype == MPI.DATATYPE_NULL:
        raise ValueError(f"{what}: MPI.DATATYPE_NULL is not a datatype of data")
    while datatype.combiner == MPI.COMBINER_DUP:  # a duplicate is its base type
        datatype = datatype.decode()[0]
    return datatype


def _to_dtype(datatype, what: str) -> np.dtype:
    """The NumPy dtype of a predefined MPI datatype; NotImplementedError for the others."""
    datatype = _resolve(datatype, what)
    if datatype.handle in _QUAD:
        raise NotImplementedError(
            f"{what}: MPI datatype {datatype.Get_name()} is IEEE quadruple precision, which "
            "NumPy cannot compute in (its float128 is x87 extended precision); not "
            "supported by mpidp.Comm")
    if not datatype.is_predefined:
        raise NotImplementedError(
            f"{what}: derived datatypes (contiguous, vector, indexed, struct, ...) are not "
            "supported by mpidp.Comm; pass a predefined datatype and a count")
    try:
        dtype = dtlib.to_numpy_dtype(datatype)
    except (ValueError, KeyError, TypeError):
        dtype = None
    if (dtype is None or dtype.kind not in _KINDS or dtype.itemsize != datatype.Get_size()
            or datatype.Get_extent() != (0, dtype.itemsize)):
        raise NotImplementedError(
            f"{what}: MPI datatype {datatype.Get_name() or datatype} is not supported by "
            "mpidp.Comm (numbers and booleans are; pair types such as MPI.DOUBLE_INT are not)")
    return dtype


def _handles(names) -> list[int]:
    found = (getattr(MPI, name, MPI.DATATYPE_NULL) for name in names)
    return [t.handle for t in found if t != MPI.DATATYPE_NULL]


_QUAD = set(_handles(("REAL16", "COMPLEX32")))  # Fortran's REAL(16): IEEE quad


def check_match(send, scount: int | None, recv, rcount: int | None,
                rwhat: str = "receive count") -> None:
    """mpi4py's checks that a sendbuf and a recvbuf describe the same message (counts None:
    the datatypes only)."""
    if send.dtype != recv.dtype:
        raise ValueError(f"mismatch in send and receive datatypes: {send.dtype} and {recv.dtype}")
    if scount != rcount:
        raise ValueError(f"mismatch in send count {scount} and {rwhat} {rcount}")

