"""Reduction operators with MPI semantics, applied in place on NumPy or CuPy arrays.

An `Op` combines a received block into a local one: ``op(acc, tmp)`` leaves
``acc ⊕ tmp`` in ``acc`` with no allocation (the ufunc writes into ``out=``).
Every MPI predefined operator is commutative and associative (up to floating
point rounding), so the algorithms may combine blocks in any order; but a sum
that several ranks compute must be computed in the same order on each, for
every rank to get the same bits (``maximum(-0.0, 0.0)`` is ``0.0``,
``maximum(0.0, -0.0)`` is ``-0.0``; a sum of two NaNs keeps the first one's
payload): `doubling.swapping`.

``AVG`` is not an MPI operator: it is the sum, divided by the number of ranks
once at the end (`Op.finish`), which is what gradient averaging needs.
``EXACT_SUM`` and ``EXACT_AVG`` are not either: order-independent sums that the
call path runs as collectives of their own (exact.py, prerounding.py). Which MPI
operator is which of these, and on which MPI datatypes MPI defines it, is the call
path's business (collectives/mpiops.py): the algorithms know no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
        if acc.size == 1:
            self.apply(acc if src is None else src, tmp, out=acc)
            return
        ufunc = self.np_ufunc if type(acc) is np.ndarray else getattr(_xp(acc), self.ufunc)
        ufunc(acc if src is None else src, tmp, out=acc)

    def apply(self, a, b, out) -> None:
        """out = a ⊕ b, `a` the first operand, whatever `out` is.

        NumPy runs ``ufunc(a, b, out=a)`` on one item as a reduction, with the operands
        the other way round: the sum of two NaNs then keeps b's payload, MAX of -0.0 and
        0.0 gives b. So one item written over its first operand is computed apart and
        copied (two partners computing a ⊕ b, one in its a, one in its b, agree)."""
        xp = np if type(out) is np.ndarray else _xp(out)
        ufunc = self.np_ufunc if xp is np else getattr(xp, self.ufunc)
        if out.size == 1 and xp.may_share_memory(a, out):
            out[...] = ufunc(a, b)
        else:
            ufunc(a, b, out=out)

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
BAND = Op("band", "bitwise_and", _INTEGER)  # MPI: integers and bytes, not logicals (bool)
BOR = Op("bor", "bitwise_or", _INTEGER)
BXOR = Op("bxor", "bitwise_xor", _INTEGER)

OPS = {op.name: op for op in (SUM, PROD, MAX, MIN, AVG, LAND, LOR, LXOR, BAND, BOR, BXOR)}

# Not MPI operators, and never handed to an algorithm: the call path runs them as a MAX
# pass and a SUM pass on integer words (exact.py). On integers EXACT_SUM is SUM.
EXACT_SUM = Op("exact_sum", "add", "iuf", exact=True)
EXACT_AVG = Op("exact_avg", "add", "f", divide=True, exact=True)
EXACT = {op.name: op for op in (EXACT_SUM, EXACT_AVG)}


class Wrapper:
    """An `Op` that stands for another: does what `op` does, and answers for it.

    The ops that watch a run subclass it and change one thing: a sub-phase's op
    that does not finish (`hierarchical`), one that logs what it does (the replay's
    recorder), one that counts reduced items (the simulator's).
    """

    __slots__ = ("op",)

    def __init__(self, op):
        self.op = op

    def __call__(self, acc, tmp, src=None) -> None:
        self.op(acc, tmp, src)

    def finish(self, block, n: int) -> None:
        self.op.finish(block, n)

    def __getattr__(self, name):
        return getattr(self.op, name)
