"""Reduction operators with MPI semantics, applied in place on NumPy or CuPy arrays.

An `Op` combines a received block into a local one: ``op(acc, tmp)`` leaves
``acc ⊕ tmp`` in ``acc`` with no allocation (the ufunc writes into ``out=``).
Every MPI predefined operator is commutative and associative (up to floating
point rounding), so the algorithms may combine blocks in any order; but a sum
that several ranks compute must be computed in the same order on each, for
every rank to get the same bits (``maximum(-0.0, 0.0)`` is ``0.0``,
``maximum(0.0, -0.0)`` is ``-0.0``; a sum of two NaNs keeps the first one's
payload): `halving._swapping`.

``AVG`` is not an MPI operator: it is the sum, divided by the number of ranks
once at the end (`Op.finish`), which is what gradient averaging needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

_NUMERIC = "iufc"  # signed, unsigned, float, complex
_INTEGER = "iu"
_LOGICAL = "iub"  # MPI allows LAND/LOR/LXOR on C integers and booleans


@dataclass(frozen=True)
class Op:
    """A reduction operator: a NumPy/CuPy ufunc name and the dtype kinds it accepts."""

    name: str
    ufunc: str
    kinds: str
    divide: bool = False  # AVG: divide by the number of ranks when the sum is complete
    # NumPy's ufunc, looked up once: a small all-reduce pays for every attribute lookup
    np_ufunc: object = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "np_ufunc", getattr(np, self.ufunc))

    def __call__(self, acc, tmp, src=None) -> None:
        """acc = acc ⊕ tmp, in place; with `src`, acc = src ⊕ tmp (acc's old value unused)."""
        ufunc = self.np_ufunc if type(acc) is np.ndarray else getattr(_xp(acc), self.ufunc)
        ufunc(acc if src is None else src, tmp, out=acc)

    def finish(self, block, n: int) -> None:
        """Turn a fully reduced block into the result (AVG divides by n; others do nothing)."""
        if self.divide and n > 1:
            _xp(block).true_divide(block, n, out=block)

    def check(self, dtype) -> None:
        """Raise TypeError if MPI does not define this op on `dtype`."""
        if not isinstance(dtype, np.dtype):
            dtype = np.dtype(dtype)
        if dtype.kind not in self.kinds:
            raise TypeError(
                f"op {self.name!r} is not defined on dtype {dtype} "
                f"(it accepts {_kind_names(self.kinds)})"
            )


def _xp(arr):
    return np if isinstance(arr, np.ndarray) else __import__("cupy")


def _kind_names(kinds: str) -> str:
    names = {"i": "signed integers", "u": "unsigned integers", "f": "floats",
             "c": "complex", "b": "booleans"}
    return ", ".join(names[k] for k in kinds)


SUM = Op("sum", "add", _NUMERIC)
PROD = Op("prod", "multiply", _NUMERIC)
MAX = Op("max", "maximum", "iuf")  # complex numbers have no order: TypeError
MIN = Op("min", "minimum", "iuf")
AVG = Op("avg", "add", "fc", divide=True)  # integer averages would truncate: floats only
LAND = Op("land", "logical_and", _LOGICAL)
LOR = Op("lor", "logical_or", _LOGICAL)
LXOR = Op("lxor", "logical_xor", _LOGICAL)
BAND = Op("band", "bitwise_and", _LOGICAL)
BOR = Op("bor", "bitwise_or", _LOGICAL)
BXOR = Op("bxor", "bitwise_xor", _LOGICAL)

OPS = {op.name: op for op in (SUM, PROD, MAX, MIN, AVG, LAND, LOR, LXOR, BAND, BOR, BXOR)}

_FROM_MPI = [  # MPI.Op is not hashable: a list of pairs
    (MPI.SUM, SUM), (MPI.PROD, PROD), (MPI.MAX, MAX), (MPI.MIN, MIN),
    (MPI.LAND, LAND), (MPI.LOR, LOR), (MPI.LXOR, LXOR),
    (MPI.BAND, BAND), (MPI.BOR, BOR), (MPI.BXOR, BXOR),
]


def resolve_op(op) -> Op:
    """Return the `Op` for an Op, a name such as ``"sum"``, or an ``MPI.Op`` such as ``MPI.SUM``."""
    for mpi_op, ours in _FROM_MPI:
        if op is mpi_op:  # the common case first: MPI.SUM itself, found without MPI calls
            return ours
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return OPS[op.lower()]
        except KeyError:
            raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}") from None
    if isinstance(op, MPI.Op):
        for mpi_op, ours in _FROM_MPI:
            if op == mpi_op:
                return ours
        raise NotImplementedError(
            f"MPI op {op!r} is not supported by mpidp (MAXLOC, MINLOC, REPLACE, NO_OP and "
            f"user-defined ops are not); supported: {sorted(OPS)}"
        )
    raise TypeError(f"op must be an mpidp Op, a name or an MPI.Op, not {type(op).__name__}")
