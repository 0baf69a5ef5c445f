"""The ordered sum of parts: every rank's parts added in one fixed order, whatever N.

    req = mpidp.iallreduce_parts(comm, [g0, g1], out, addends=8, ordered=True)

The order is the ranks', and within a rank its list's: rank 0's parts in order,
then rank 1's, and so on. Each item is the left fold of its addends in that
order, in the parts' dtype (float16 parts in float32, rounded at the end),
divided by `addends` for the average:

        s = a[0];  s = s + a[1];  ...;  s = s + a[P-1]      (item by item)
        out = s                 or, averaged:  out = s / P

So the bits depend on the sequence of addends and on nothing else: not on the
number of ranks, nor on how the sequence is cut among them (one rank holding all
the parts, in the same order, gets the same bits), nor on the algorithm. That is
what deterministic data parallelism needs (determinism.py): its micro-shards are
cut from the global batch in order, and rank r holds the r-th run of them. Where
the result must not depend on the order either, the exact sum (exact.py) is the
one: the correctly rounded sum of the multiset, at two to three times the cost.
Here each addition rounds, as one rank's loop over the parts would. Special
values follow IEEE: inf + -inf is NaN, a NaN's payload is not kept (the
canonical quiet NaN), -0.0 only where every addend is -0.0 (and where there are
none, the exact sum's rule for an empty sum).

The exchange is the exact sum's direct path (exact_direct.py): the ranks swap how
many parts each holds, block j of every part goes raw to rank j, rank j sums its
block's addends in rank order (`local_ordered`, a chunk at a time), and the chosen
all-gather gathers the sums (a reduce-scatter stops before it). Cost (G bytes of
the dtype, h parts on the busiest rank, A the all-gather's cost):
(N-1)·α + h·G(N-1)/N·β + A(G) (+ (N-1)·α to swap the counts, unless the caller
passes them: `held`), and P additions over G/N bytes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .algorithms.blocks import Blocks
from .algorithms.ops import Op
from .exact import agree_sum, plan_direct
from .plan import Call, Plan

# Not MPI operators, and not names a caller passes: the ops of the ordered sums' signatures
ORDERED_SUM = Op("ordered_sum", "add", "f")
ORDERED_AVG = Op("ordered_avg", "add", "f", divide=True)


class Count(NamedTuple):
    """What the direct path's rounds read of the sum: the number of addends, all ranks'."""

    addends: int


class Acc(NamedTuple):
    """The local sum's scratch: a chunk's sums in `wide`'s dtype (cut to size by `y`)."""

    y: object


def local_ordered(parts, out, n: Count, s: Acc, average: bool = False) -> None:
    """out = the left fold of `parts` (one chunk of each addend, in order) in the sum's
    dtype (`wide`), divided by the number of addends for the average, then stored in
    out's dtype (float16: rounded there, once)."""
    if not parts:  # no addends at all: -0.0, the exact sum's rule for an empty sum
        out[...] = -0.0
        return
    acc = s.y
    with np.errstate(over="ignore", invalid="ignore"):  # ±inf and NaN: IEEE's, kept
        np.copyto(acc, parts[0])
        for x in parts[1:]:
            np.add(acc, x, out=acc)
        if average and n.addends > 1:
            np.true_divide(acc, n.addends, out=acc)
        np.copyto(out, acc, casting="same_kind")
    if np.isnan(np.maximum.reduce(out, initial=0)):  # one read: NaN if any item is NaN
        out[np.isnan(out)] = np.nan  # the canonical quiet NaN, whatever payload came through


def wide(dtype) -> np.dtype:
    """The dtype the sum is folded in: float32 and float64 their own, float16 float32."""
    dtype = np.dtype(dtype).newbyteorder("=")  # (parts of either byte order: summed in ours)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def plan_ordered(call: Call, parts: list, out, average: bool, algorithm: str, addends: int,
                 blocks: Blocks | None = None, by_rank: list[int] | None = None) -> Plan:
    """The plan of an ordered all-reduce (or, with `blocks`, reduce-scatter) of `parts`:
    the exact sum's direct path (`exact.plan_direct`) with `local_ordered` as its sum.

    Args:
        parts: this rank's addends in order, flat arrays of the vector's size.
        out: the result: the vector (all-reduce) or this rank's block (reduce-scatter).
        algorithm: the all-reduce asked for, which names the all-gather (`exact.GATHER_FOR`);
            a reduce-scatter's is checked and has no all-gather.
        addends: over all ranks, the same on every rank.
        by_rank: each rank's number of parts, where the caller knows them (checked
            against this rank's, and with MPIDP_DEBUG across ranks); None: the ranks
            swap them in a first round.
    """
    op = ORDERED_AVG if average else ORDERED_SUM
    if call.debug:
        agree_sum(call, out, op, algorithm, addends, blocks, by_rank, len(parts))

    def acc(pool, items):
        return Acc(pool.take(np.empty(0, wide(out.dtype)), items))

    one = call.comm.Get_size() == 1  # (one rank: nothing to swap)
    return plan_direct(call, parts, out, Count(addends), op, algorithm, blocks,
                       [len(parts)] if one else by_rank, local_ordered, acc, "ordered")
