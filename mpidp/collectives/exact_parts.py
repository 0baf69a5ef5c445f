"""The sums of parts: `iallreduce_parts` and `ireduce_scatter_parts`, checked, planned.

Each rank passes a list of arrays (any number, none included) and `addends`, the
total over all ranks; the checks below refuse what one rank can see is wrong, and
`exact.plan_exact` plans the exact sum (the direct path or the words path), or
with ``ordered=True`` `ordered.plan_ordered` the sum in rank order.
"""

from __future__ import annotations

import numpy as np

from ..arrays import array_module, flat
from ..untrusted import index
from .algorithms.blocks import Blocks
from .algorithms.ops import EXACT_AVG, EXACT_SUM
from .checks import check_buffer
from .exact import plan_exact
from .ordered import plan_ordered
from .plan import Call, Plan


def _check_parts(parts, out) -> list:
    check_buffer(out, "out", writable=True)
    if array_module(out) is not np:
        raise TypeError("the sums of parts take NumPy arrays (CuPy arrays are not supported)")
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


def _held(call: Call, parts: list, n: int, held) -> list[int] | None:
    """`held`, each rank's number of parts where the caller knows them, as the list of
    whole numbers it is; refused where this rank can see it is wrong."""
    if held is None:
        return None
    size, rank = call.comm.Get_size(), call.comm.Get_rank()
    if not isinstance(held, list | tuple):
        raise TypeError(f"held must be a list of whole numbers (one per rank), not "
                        f"{type(held).__name__}")
    by_rank = [index(h, f"held[{q}]") for q, h in enumerate(held)]
    if len(by_rank) != size:
        raise ValueError(f"held: need one number of parts per rank ({size}), got {len(by_rank)}")
    if min(by_rank) < 0 or sum(by_rank) != n:
        raise ValueError(f"held={by_rank}: each rank's number of parts, adding up to "
                         f"addends={n}")
    if by_rank[rank] != len(parts):
        raise ValueError(f"held[{rank}]={by_rank[rank]}, but this rank holds {len(parts)} parts")
    return by_rank


def _plan(call: Call, parts: list, out, addends, algorithm: str, average: bool, ordered: bool,
          held, blocks: Blocks | None = None) -> Plan:
    if out.dtype.kind not in "f":
        raise TypeError(f"the sum of parts takes float arrays, not {out.dtype}")
    n = _addends(call, parts, addends)
    by_rank = _held(call, parts, n, held)
    if ordered:
        return plan_ordered(call, parts, flat(out), average, algorithm, n, blocks, by_rank)
    return plan_exact(call, parts, flat(out), EXACT_AVG if average else EXACT_SUM, algorithm,
                      n, blocks, held=len(parts), by_rank=by_rank)


def plan_parts(call: Call, parts, out, addends: int, algorithm: str = "auto",
               average: bool = False, ordered: bool = False, held=None) -> Plan:
    """Check and set up the exact (or ordered) sum of every rank's `parts` into `out`."""
    return _plan(call, _check_parts(parts, out), out, addends, algorithm, average, ordered, held)


def plan_parts_rs(call: Call, parts, out, counts, addends: int, algorithm: str = "auto",
                  average: bool = False, ordered: bool = False, held=None) -> Plan:
    """Check and set up the exact (or ordered) reduce-scatter of every rank's `parts`."""
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
    return _plan(call, parts, out, addends, algorithm, average, ordered, held, blocks)
