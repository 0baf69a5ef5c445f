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

Two exchanges give these bits; ``algorithm="auto"`` takes the one the comm's cost
model predicts the faster (`ordered_chain.route`), a named algorithm the direct path:

- the exact sum's direct path (exact_direct.py): block j of every part goes raw to
  rank j, rank j sums its block's addends in rank order (`local_ordered`, a chunk at
  a time), and the chosen all-gather gathers the sums (a reduce-scatter stops before
  it). Cost (G bytes of the dtype, h parts on the busiest rank, A the all-gather's
  cost): h(N-1)·α + h·G(N-1)/N·β + A(G), and P additions over G/N bytes;
- the chain (ordered_chain.py): the running sum goes from rank 0 to rank N-1, each
  rank adding its parts, in segments, and the last rank broadcasts the result. Each
  rank sends the sum once, however many parts it holds: the path of ranks holding
  several parts (deterministic DDP's micro-shards).

Either swaps first how many parts each rank holds ((N-1)·α), unless the caller
passes them (`held`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .addrate import add_rate
from .algorithms import entry
from .algorithms.blocks import Blocks
from .algorithms.ops import Op
from .cost import choose, model
from .exact import agree_sum, plan_direct
from .ordered_chain import Route, chain_rounds, finish, first, route
from .placement import locate
from .plan import Call, Plan, Signed, signed
from .state import state

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
    first(s.y, parts)
    finish(s.y, out, n.addends, average)


def wide(dtype) -> np.dtype:
    """The dtype the sum is folded in: float32 and float64 their own, float16 float32."""
    dtype = np.dtype(dtype).newbyteorder("=")  # (parts of either byte order: summed in ours)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


class Path(NamedTuple):
    """An ordered sum's path, worked out once per signature (`route`): the chain, its
    segments, signature and broadcast; or the direct path (`exact.plan_direct`)."""

    route: Route
    signed: Signed | None = None
    bcast: object = None  # the registered broadcast (chain, all-reduce)


def plan_ordered(call: Call, parts: list, out, average: bool, algorithm: str, addends: int,
                 blocks: Blocks | None = None, by_rank: list[int] | None = None) -> Plan:
    """The plan of an ordered all-reduce (or, with `blocks`, reduce-scatter) of `parts`:
    with ``algorithm="auto"`` the chain (ordered_chain.py) or the direct path, whichever
    the comm's cost model predicts the faster; with an algorithm named, the exact sum's
    direct path (`exact.plan_direct`, with `local_ordered` as its sum) and that
    algorithm's all-gather.

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
    comm, n = call.comm, call.comm.Get_size()
    held = [len(parts)] if n == 1 else by_rank
    rs = blocks is not None
    count = blocks.total if rs else out.size
    h = max(held) if held else -(-addends // n)  # the busiest rank's parts (or the average)
    key = ("ordered", rs, count, blocks and blocks.counts, out.dtype, op.name, algorithm,
           addends, h)
    path = call.setup(key, _route, comm, rs, count, out.dtype, op, algorithm, addends, h,
                      blocks)
    if not path.route.chain:
        def acc(pool, items):
            return Acc(pool.take(np.empty(0, wide(out.dtype)), items))

        return plan_direct(call, parts, out, Count(addends), op, algorithm, blocks, held,
                           local_ordered, acc, "ordered")
    tag = call.tag(path.signed)
    bcast = None
    if path.bcast is not None:
        bcast = path.bcast.bound(locate(comm, call.state, "bcast", path.bcast.name))
    pool, last = call.state.pool, comm.Get_rank() == n - 1
    acc = pool.take(np.empty(0, wide(out.dtype)), count)
    whole = pool.take(np.empty(0, out.dtype), count if rs and last else 0)
    counts = pool.take(np.empty(0, np.int64), 0 if held else n)
    args = (comm, parts, out, addends, acc, Blocks.even(count, path.route.segments), bcast,
            counts, held, op.divide, blocks, whole)
    return Plan(call, chain_rounds, args, tag, None, (acc, whole, counts))


def _route(comm, rs: bool, count: int, dtype, op: Op, algorithm: str, addends: int, h: int,
           blocks: Blocks | None) -> Path:
    """The path of an ordered sum with these arguments (every rank's alike): the chain
    only where ``auto`` leaves the choice to the model (`ordered_chain.route`)."""
    n = comm.Get_size()
    if algorithm != "auto" or n == 1 or count == 0:
        return Path(Route(False))
    nbytes = count * dtype.itemsize
    gather = None if rs else choose(comm, "allgather", nbytes, "auto")
    bcast = None if rs else choose(comm, "bcast", nbytes, "auto")
    m = model(comm)
    if state(comm).measured:  # calibrated: γ as this vector's adds run (addrate.py)
        m = m._replace(gamma=add_rate(comm, count, dtype, wide(dtype)))
    r = route(m, n, count, dtype.itemsize, wide(dtype).itemsize, addends, h, gather, bcast)
    if not r.chain:
        return Path(r)
    collective = "reduce_scatter" if rs else "allreduce"
    return Path(r, signed(collective, (blocks.counts if rs else count, addends), dtype, op,
                          f"chain+{bcast or 'none'}"), bcast and entry("bcast", bcast))
