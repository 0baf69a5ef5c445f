"""The exact sums of parts: `iallreduce_parts` and `ireduce_scatter_parts`, checked, planned.

Each rank passes a list of arrays (any number, none included) and `addends`, the
total over all ranks; the checks below refuse what one rank can see is wrong, and
`exact.plan_exact` plans the sum (the direct path or the words path).
"""

from __future__ import annotations

import numpy as np

from ..arrays import array_module, flat
from ..untrusted import index
from .algorithms.blocks import Blocks
from .algorithms.ops import EXACT_AVG, EXACT_SUM
from .checks import check_buffer
from .exact import plan_exact
from .plan import Call, Plan


def _check_parts(parts, out) -> list:
    check_buffer(out, "out", writable=True)
    if array_module(out) is not np:
        raise TypeError("the exact sum takes NumPy arrays (CuPy arrays are not supported)")
    parts = list(parts)
    for i, x in enumerate(parts):
        check_buffer(x, f"parts[{i}]")
        if x.dtype != out.dtype or x.size != out.size:
            raise ValueError(f"parts[{i}] is {x.size} items of {x.dtype}, out {out.size} of "
                             f"{out.dtype}: every part must match out")
    return [flat(x) for x in parts]


def _addends(call: Call, parts: list, addends) -> int:
    """`addends` as the whole number it is, refused where this rank can see it is wrong:
    fewer than the parts it holds, or (one rank) other than their number."""
    n = index(addends, "addends")
    if n < 0:
        raise ValueError(f"addends={n}: the number of addends over all ranks, not negative")
    if len(parts) > n:
        raise ValueError(f"this rank holds {len(parts)} parts, more than addends={n} "
                         "(the number of addends over all ranks)")
    if call.comm.Get_size() == 1 and len(parts) != n:
        raise ValueError(f"one rank holds all {len(parts)} parts, but addends={n}")
    return n


def plan_parts(call: Call, parts, out, addends: int, algorithm: str = "auto",
               average: bool = False) -> Plan:
    """Check and set up the exact sum of every rank's `parts` into `out`."""
    parts = _check_parts(parts, out)
    if out.dtype.kind not in "f":
        raise TypeError(f"the exact sum of parts takes float arrays, not {out.dtype}")
    n = _addends(call, parts, addends)
    return plan_exact(call, parts, flat(out), EXACT_AVG if average else EXACT_SUM, algorithm,
                      n, held=len(parts))


def plan_parts_rs(call: Call, parts, out, counts, addends: int, algorithm: str = "auto",
                  average: bool = False) -> Plan:
    """Check and set up the exact reduce-scatter of every rank's `parts` into `out`."""
    blocks = Blocks([index(c, f"counts[{i}]") for i, c in enumerate(counts)])
    if len(blocks.counts) != call.comm.Get_size():
        raise ValueError(f"need one count per rank ({call.comm.Get_size()}), got "
                         f"{len(blocks.counts)}")
    mine = blocks.counts[call.comm.Get_rank()]
    check_buffer(out, "out", writable=True)
    if out.size != mine:
        raise ValueError(f"out holds {out.size} items, this rank's block {mine}")
    whole = array_module(out).empty(blocks.total, dtype=out.dtype)  # only for the checks
    parts = _check_parts(parts, whole)
    if out.dtype.kind not in "f":
        raise TypeError(f"the exact sum of parts takes float arrays, not {out.dtype}")
    n = _addends(call, parts, addends)
    return plan_exact(call, parts, flat(out), EXACT_AVG if average else EXACT_SUM, algorithm,
                      n, blocks, held=len(parts))
