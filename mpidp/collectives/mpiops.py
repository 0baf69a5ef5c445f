"""MPI's operators as mpidp's: which `Op` an ``MPI.Op`` is, and where MPI defines each one.

The algorithms take an `ops.Op` and know no MPI; the call path resolves what the
caller passed (an Op, a name such as ``"sum"``, or ``MPI.SUM``) with `resolve_op`,
and `mpidp.Comm` checks the datatype against MPI's table of combinations
(`DEFINED_ON`, `OpError`).
"""

from __future__ import annotations

from mpi4py import MPI

from .algorithms.ops import (
    BAND,
    BOR,
    BXOR,
    EXACT,
    LAND,
    LOR,
    LXOR,
    MAX,
    MIN,
    OPS,
    PROD,
    SUM,
    Op,
)

_FROM_MPI = [  # MPI.Op is not hashable: a list of pairs
    (MPI.SUM, SUM), (MPI.PROD, PROD), (MPI.MAX, MAX), (MPI.MIN, MIN),
    (MPI.LAND, LAND), (MPI.LOR, LOR), (MPI.LXOR, LXOR),
    (MPI.BAND, BAND), (MPI.BOR, BOR), (MPI.BXOR, BXOR),
]


# ---------------------------------------------------------------- MPI's table of combinations
# MPI-4.1, section 6.9.2: each predefined operation is defined on some groups of basic
# datatypes (dropin/datatypes.GROUPS says which datatype is in which group); on any other, a
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
