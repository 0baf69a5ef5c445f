"""Which predefined op MPI defines on which datatype: `check_op`, as mpi4py's MPI raises.

mpidp.Comm refuses a reduction MPI would refuse (``MPI.ERR_OP``) before any message:
the datatype of the buffer spec (given, or inferred from the buffer's format as mpi4py
infers it) falls in one of the MPI standard's groups of basic datatypes, and
`mpiops.DEFINED_ON` says which ops each group takes.
"""

from __future__ import annotations

from mpi4py import MPI

from .. import mpiops as ops
from .bufspec import _handles, _resolve, _unpack

# The MPI standard's groups of basic datatypes (MPI-4.1, section 6.9.2), by mpi4py's
# names; the ones this MPI library lacks are skipped. Outside every group (CHAR, WCHAR,
# CHARACTER, PACKED), no predefined op is defined. Two kinds of datatype that are not
# in the standard are put where the libraries themselves treat them: FLOAT16_T (MPICH's
# and Open MPI's MPIX_C_FLOAT16) with floating point, Open MPI's LOGICAL1/2/8/16 with
# logical (as its LOGICAL4; docs/dropin.md).
GROUPS = {
    ops.C_INTEGER: ("INT", "LONG", "SHORT", "UNSIGNED_SHORT", "UNSIGNED", "UNSIGNED_LONG",
                    "LONG_LONG", "UNSIGNED_LONG_LONG", "SIGNED_CHAR", "UNSIGNED_CHAR",
                    "INT8_T", "INT16_T", "INT32_T", "INT64_T", "UINT8_T", "UINT16_T",
                    "UINT32_T", "UINT64_T"),
    ops.FORTRAN_INTEGER: ("INTEGER", "INTEGER1", "INTEGER2", "INTEGER4", "INTEGER8",
                          "INTEGER16"),
    ops.FLOATING: ("FLOAT", "DOUBLE", "LONG_DOUBLE", "REAL", "DOUBLE_PRECISION", "REAL2",
                   "REAL4", "REAL8", "REAL16", "FLOAT16_T"),
    ops.LOGICAL: ("C_BOOL", "CXX_BOOL", "LOGICAL", "LOGICAL1", "LOGICAL2", "LOGICAL4",
                  "LOGICAL8", "LOGICAL16"),
    ops.COMPLEX: ("C_COMPLEX", "C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX", "C_LONG_DOUBLE_COMPLEX",
                  "CXX_FLOAT_COMPLEX", "CXX_DOUBLE_COMPLEX", "CXX_LONG_DOUBLE_COMPLEX",
                  "COMPLEX", "DOUBLE_COMPLEX", "COMPLEX4", "COMPLEX8", "COMPLEX16",
                  "COMPLEX32"),
    ops.BYTE: ("BYTE",),
    ops.MULTI: ("AINT", "OFFSET", "COUNT"),
    ops.PAIR: ("FLOAT_INT", "DOUBLE_INT", "LONG_INT", "TWOINT", "SHORT_INT", "LONG_DOUBLE_INT",
               "TWOREAL", "TWODOUBLE_PRECISION", "TWOINTEGER"),
}
# no datatype given: what mpi4py infers from the buffer's format, by NumPy kind
_INFERRED = {"i": ops.C_INTEGER, "u": ops.C_INTEGER, "f": ops.FLOATING, "c": ops.COMPLEX,
             "b": ops.LOGICAL, "S": None}  # "S": MPI.CHAR
_group_of: dict[int, str] = {}  # datatype handle -> group, made at the first reduction



def check_op(op, spec, view) -> None:
    """Raise `ops.OpError` (``MPI.Exception``, ``MPI.ERR_OP``) unless MPI defines `op` on
    the datatype of the buffer spec `spec` (parsed into `view`). Ops that are not MPI's
    (AVG, user-defined) are left to `api`."""
    name = ops.mpi_name(op)
    if name is None:
        return
    datatype = _unpack(spec, vector=False)[3] if isinstance(spec, (list, tuple)) else None
    if datatype is None:  # the buffer's own: mpi4py's datatype for its format
        group = _INFERRED.get(view.dtype.kind)
    else:
        if not _group_of:
            _group_of.update({h: g for g, names in GROUPS.items() for h in _handles(names)})
        group = _group_of.get(datatype.handle) if isinstance(datatype, MPI.Datatype) else None
        if group is None:  # a type code, a duplicate, or in no group: resolve it (MPI calls)
            datatype = _resolve(datatype, "datatype")
            group = _group_of.get(datatype.handle)
    if group not in ops.DEFINED_ON[name]:
        label = (f"MPI datatype {datatype.Get_name()}" if datatype is not None else
                 f"a {view.dtype} buffer (MPI.CHAR)" if view.dtype.kind == "S" else
                 f"a {view.dtype} buffer")
        raise ops.OpError(name, label, group)
