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
``EXACT_SUM`` and ``EXACT_AVG`` are not either: order-independent sums that the
call path runs as collectives of their own (exact.py, prerounding.py).
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
    exact: bool = False  # EXACT_SUM, EXACT_AVG: run as pre-rounded integer sums (exact.py)
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

# Not MPI operators, and never handed to an algorithm: the call path runs them as a MAX
# pass and a SUM pass on integer words (exact.py). On integers EXACT_SUM is SUM.
EXACT_SUM = Op("exact_sum", "add", "iuf", exact=True)
EXACT_AVG = Op("exact_avg", "add", "f", divide=True, exact=True)
EXACT = {op.name: op for op in (EXACT_SUM, EXACT_AVG)}

_FROM_MPI = [  # MPI.Op is not hashable: a list of pairs
    (MPI.SUM, SUM), (MPI.PROD, PROD), (MPI.MAX, MAX), (MPI.MIN, MIN),
    (MPI.LAND, LAND), (MPI.LOR, LOR), (MPI.LXOR, LXOR),
    (MPI.BAND, BAND), (MPI.BOR, BOR), (MPI.BXOR, BXOR),
]


# ---------------------------------------------------------------- MPI's table of combinations
# MPI-4.1, section 6.9.2: each predefined operation is defined on some groups of basic
# datatypes (bufspec.GROUPS says which datatype is in which group); on any other, a
# reduction is erroneous, and mpidp.Comm raises MPI.Exception (MPI.ERR_OP), as MPICH and
# Open MPI do for most such calls (docs/dropin.md lists where they compute one anyway).
C_INTEGER, FORTRAN_INTEGER, FLOATING = "C integer", "Fortran integer", "floating point"
LOGICAL, COMPLEX, BYTE, MULTI = "logical", "complex", "byte", "multi-language"
PAIR = "pair"  # MPI.DOUBLE_INT, ...: MAXLOC and MINLOC, which mpidp does not compute
_ORDERED = (C_INTEGER, FORTRAN_INTEGER, FLOATING, MULTI)
_ARITHMETIC = (C_INTEGER, FORTRAN_INTEGER, FLOATING, COMPLEX, MULTI)
_LOGIC = (C_INTEGER, LOGICAL)
_BITS = (C_INTEGER, FORTRAN_INTEGER, BYTE, MULTI)
DEFINED_ON = {
    "max": _ORDERED, "min": _ORDERED, "sum": _ARITHMETIC, "prod": _ARITHMETIC,
    "land": _LOGIC, "lor": _LOGIC, "lxor": _LOGIC, "band": _BITS, "bor": _BITS, "bxor": _BITS,
    "maxloc": (PAIR,), "minloc": (PAIR,),
    "replace": (), "no_op": (),  # one-sided accumulates only: in a collective, on nothing
}
_MPI_NAMES = [(mpi_op, ours.name) for mpi_op, ours in _FROM_MPI] + [
    (MPI.MAXLOC, "maxloc"), (MPI.MINLOC, "minloc"), (MPI.REPLACE, "replace"),
    (MPI.NO_OP, "no_op")]


def mpi_name(op) -> str | None:
    """The key in `DEFINED_ON` of a predefined MPI op (or of the mpidp op or name of
    one: SUM, "sum"); None for the others (AVG, user-defined ops)."""
    for mpi_op, name in _MPI_NAMES:
        if op is mpi_op:  # the common case first: MPI.SUM itself
            return name
    if isinstance(op, MPI.Op):
        return next((name for mpi_op, name in _MPI_NAMES if op == mpi_op), None)
    name = op.name if isinstance(op, Op) else op.lower() if isinstance(op, str) else None
    return name if name in OPS and name in DEFINED_ON else None


class OpError(MPI.Exception):
    """An op on a datatype MPI does not define it on: ``MPI.Exception`` with the error
    class MPICH and Open MPI give there (``MPI.ERR_OP``), saying why."""

    def __init__(self, name: str, datatype: str, group: str | None):
        super().__init__(MPI.ERR_OP)
        groups = DEFINED_ON[name]
        on = ", ".join(groups[:-1]) + (" and " if len(groups) > 1 else "") + (groups[-1:] or
                                                                              ("nothing",))[0]
        kind = f"a {group} datatype" if group else "in none of the standard's groups"
        self.message = (f"MPI.{name.upper()} is not defined on {datatype} ({kind}): MPI-4.1, "
                        f"section 6.9.2, defines it on {on} datatypes (MPI.ERR_OP)")

    def __str__(self) -> str:
        return self.message


def resolve_op(op) -> Op:
    """Return the `Op` for an Op, a name such as ``"sum"``, or an ``MPI.Op`` such as ``MPI.SUM``."""
    for mpi_op, ours in _FROM_MPI:
        if op is mpi_op:  # the common case first: MPI.SUM itself, found without MPI calls
            return ours
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return OPS.get(op.lower()) or EXACT[op.lower()]
        except KeyError:
            raise ValueError(f"unknown op {op!r}; expected one of {sorted({**OPS, **EXACT})}"
                             ) from None
    if isinstance(op, MPI.Op):
        for mpi_op, ours in _FROM_MPI:
            if op == mpi_op:
                return ours
        raise NotImplementedError(
            f"MPI op {op!r} is not supported by mpidp (MAXLOC, MINLOC, REPLACE, NO_OP and "
            f"user-defined ops are not); supported: {sorted(OPS)}"
        )
    raise TypeError(f"op must be an mpidp Op, a name or an MPI.Op, not {type(op).__name__}")
