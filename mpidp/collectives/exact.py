"""The exact, order-independent sum on the call path: EXACT_SUM, EXACT_AVG, and sums of parts.

    mpidp.allreduce(comm, x, y, op=mpidp.EXACT_SUM)          # y: the same bits on any N
    req = mpidp.iallreduce_parts(comm, [g0, g1, g2], out, addends=12)

Every item is pre-rounded to a grid set by its largest addend (prerounding.py has the
derivation) and the rounded addends are summed exactly. Two paths, chosen from the
number of addends and ranks alone (`exact_direct.takes_direct`), give the same bits:

- the direct path (up to three addends a rank on average, EXACT_SUM's op always):
  block j of every addend goes raw to rank j, which holds all the addends of its
  items and sums them there (`exact_steps.local_sum`, a chunk at a time); the
  chosen algorithm all-gathers the sums. SUM's bytes with one addend a rank
  (exact_direct.py).
- the words path (more addends a rank): a MAX all-reduce of a small code per item,
  the SUM all-reduce (or reduce-scatter) of float64 words with the chosen algorithm,
  the conversion back: `exact_rounds` chains the two collectives' generators.

Either is one generator of rounds, so the blocking call, the I-form, the persistent
``*_init`` and `mpidp.Comm` all run it through the same `Plan` as any collective,
with one tag: `plans` hands an exact op to `plan_exact`, and `api`'s parts functions
start `exact_parts.plan_parts` and `plan_parts_rs`.

`iallreduce_parts` sums several arrays per rank (a rank may hold any number of
the addends, none included): the result is bitwise what EXACT_SUM gives on the
same multiset of addends, however they are spread over ranks, provided every
rank passes the same total `addends` (the grid depends on it). On a communicator
of one rank (``MPI.COMM_SELF``, or one `mpidp.sim` rank) it is a local exact sum.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .algorithms import Algorithm, entry
from .algorithms.blocks import Blocks
from .algorithms.ops import MAX, SUM, Op
from .algorithms.prerounding import Grid, grid
from .algorithms.rounds import Rounds
from .checks import check_algorithm
from .cost import choose
from .exact_direct import chunk_items, direct_items, direct_rounds, takes_direct
from .exact_steps import Scratch, back, codes, cut, local_sum, scratch_for
from .placement import locate
from .plan import Call, Plan, Signed, signed

# A reduce-scatter's MAX pass (an all-reduce of the codes) by the algorithm of its family
CODE_FOR = {"ring": "ring", "recursive_halving": "rabenseifner"}
# The direct path's all-gather of the sums, by the all-reduce asked for (others: doubling)
GATHER_FOR = {"ring": "ring"}


class Passes(NamedTuple):
    """What an exact call's signature determines, worked out once (`plan.Call.setup`)."""

    signed: Signed  # its signature and description ("code+word" as the algorithm)
    code: Algorithm  # the MAX pass's all-reduce, over the codes
    word: Algorithm  # the SUM pass's all-reduce or reduce-scatter, over the words
    scratch: tuple[int, int]  # items of scratch each pass's algorithm needs


def exact_rounds(comm, parts, out, g: Grid, code_algo, word_algo, s: Scratch,
                 average: bool = False, reduce_scatter: Blocks | None = None) -> Rounds:
    """The words path's three passes as one generator of rounds (prerounding.py derives
    them); `exact_steps.local_sum` is the same without the collectives.

    Args:
        parts: this rank's addends, arrays of out's size and dtype (any number). They
            may include `out`: every part is read before out is written.
        out: the result (all-reduce); with `reduce_scatter` (the blocks of the items),
            this rank's block of it.
        code_algo, word_algo: the all-reduce (or reduce-scatter) generators for the
            MAX pass and the SUM pass, ``(comm, buf, blocks, op, tmp)``.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    W = s.words
    count = W.size // g.words
    rs = reduce_scatter is not None
    if g.plain:  # one addition: a + b == b + a; ranks without addends add -0.0
        if not rs and g.word == out.dtype and not any(np.may_share_memory(x, out)
                                                      for x in parts[1:]):
            W = out  # the all-reduce runs in out itself (in place: no copy at all)
        if not parts:
            W[...] = -0.0
        elif parts[0] is not W:
            np.copyto(W, parts[0])
        with np.errstate(over="ignore", invalid="ignore"):  # ±inf and inf - inf: the rules
            for x in parts[1:]:
                np.add(W, x, out=W)
    else:
        lows = codes(parts, g, s, count)
        yield from code_algo(comm, s.code, Blocks.even(count, n), MAX, s.code_tmp)
        scaled, special = cut(parts, g, s, count, rs, lows)
    if rs:
        yield from word_algo(comm, W, Blocks([c * g.words for c in reduce_scatter.counts]),
                             SUM, s.words_tmp)
        lo = reduce_scatter.displs[rank]
        hi = lo + reduce_scatter.counts[rank]
    else:
        yield from word_algo(comm, W, Blocks.even(W.size, n), SUM, s.words_tmp)
        lo, hi = 0, count
    if g.plain:
        if average and g.addends > 1:  # two addends: halved in float64 (exact), then rounded
            np.true_divide(W[lo:hi], g.addends, out=W[lo:hi])
        if W is not out:
            np.copyto(out, W[lo:hi], casting="same_kind")
        with np.errstate(invalid="ignore", over="ignore"):
            suspect = np.isnan(np.add.reduce(out))  # one read: NaN if any item is NaN
        if suspect:
            out[np.isnan(out)] = np.nan  # the canonical quiet NaN, whatever payload came through
        return
    if rs:
        special = special[(special >= lo) & (special < hi)] - lo
        scaled = scaled[(scaled >= lo) & (scaled < hi)] - lo
    back(W, g, rs, lo, hi, s.code[lo:hi], out, special, scaled, average)


# ------------------------------------------------------------ the plans


def plan_exact(call: Call, parts: list, out, op: Op, algorithm: str, addends: int,
               blocks: Blocks | None = None, held: int | None = None,
               by_rank: list[int] | None = None) -> Plan:
    """The plan of an exact all-reduce (or, with `blocks`, reduce-scatter) of `parts`.

    Args:
        parts: this rank's addends, flat arrays of the vector's size.
        out: the result: the vector (all-reduce) or this rank's block (reduce-scatter).
        algorithm: for the SUM pass, and the MAX pass (a reduce-scatter's: `CODE_FOR`).
        addends: over all ranks, the same on every rank.
        held: (the sums of parts) the parts this rank holds: with MPIDP_DEBUG the ranks
            check that they add up to `addends`.
        by_rank: (the sums of parts) each rank's number of parts, where the caller knows
            them: the direct path need not swap them.
    """
    comm = call.comm
    rs = blocks is not None
    count = blocks.total if rs else out.size
    g = grid(out.dtype, addends, op.divide)

    def setup() -> Passes:
        collective = "reduce_scatter" if rs else "allreduce"
        word_name = choose(comm, collective, count * g.words * 8, algorithm)
        code_name = (CODE_FOR[word_name] if rs else
                     choose(comm, "allreduce", count * g.code.itemsize, algorithm))
        code_algo = entry("allreduce", code_name)  # (the placement is handed in per call)
        word_algo = entry("reduce_scatter" if rs else "allreduce", word_name)
        code_scratch, word_scratch = code_algo.scratch, word_algo.scratch
        word_blocks = (Blocks([c * g.words for c in blocks.counts]) if rs
                       else Blocks.even(count * g.words, comm.Get_size()))
        items = (code_scratch(Blocks.even(count, comm.Get_size())), word_scratch(word_blocks))
        return Passes(signed(collective, (blocks.counts if rs else count, addends), out.dtype,
                             op, f"{code_name}+{word_name}"), code_algo, word_algo, items)

    if call.debug:
        agree_sum(call, out, op, algorithm, addends, blocks, by_rank, held)
    if takes_direct(g, comm.Get_size()):
        def grid_scratch(pool, items):
            return scratch_for(pool, g, items, 0, 0)

        return plan_direct(call, parts, out, g, op, algorithm, blocks,
                           [1] * comm.Get_size() if held is None else by_rank,
                           local_sum, grid_scratch, "direct")
    key = ("exact", rs, count, blocks and blocks.counts, out.dtype, op.name, algorithm, addends)
    s = call.setup(key, setup)
    tag = call.tag(s.signed)
    code_algo = s.code.bound(locate(comm, call.state, "allreduce", s.code.name))
    word_algo = s.word.bound(locate(comm, call.state, "reduce_scatter" if rs else "allreduce",
                                    s.word.name))
    scratch = scratch_for(call.state.pool, g, count, *s.scratch)
    args = (comm, parts, out, g, code_algo, word_algo, scratch, op.divide, blocks)
    return Plan(call, exact_rounds, args, tag, None, tuple(scratch))


def agree_sum(call: Call, out, op: Op, algorithm: str, addends: int, blocks: Blocks | None,
              by_rank: list[int] | None, held: int | None) -> None:
    """(MPIDP_DEBUG) The ranks compare a sum's arguments as passed, before auto's
    (collective) set-up, and (sums of parts) that the parts they hold add up."""
    rs = blocks is not None
    collective = "reduce_scatter" if rs else "allreduce"
    check_algorithm(collective, algorithm)
    call.agree(collective, count=blocks.counts if rs else out.size, dtype=out.dtype,
               op=op.name, algorithm=algorithm, addends=addends, held=by_rank)
    if held is not None:
        call.agree_total(collective, held, addends)


def plan_direct(call: Call, parts: list, out, g, op: Op, algorithm: str,
                blocks: Blocks | None, held: list[int] | None, local, scratch,
                kind: str) -> Plan:
    """The plan of the direct path (`exact_direct`): raw addends to their items' owners,
    `local`'s sum there (the exact sum's `local_sum`, ordered.py's `local_ordered`), and
    (all-reduce) the all-gather of the sums.

    Args:
        g: what the rounds and `local` read of the sum (`addends`: its Grid, or a count).
        held: each rank's number of addends where known (the op path: one each), else
            swapped first.
        scratch: ``scratch(pool, items)``, `local`'s scratch for a chunk of items.
        kind: the path's name in the signature's algorithm, ``kind+allgather``.
    """
    comm, n, rank = call.comm, call.comm.Get_size(), call.comm.Get_rank()
    rs = blocks is not None
    count = blocks.total if rs else out.size
    layout = blocks if rs else Blocks.even(count, n)

    def setup() -> tuple[Signed, Algorithm | None]:
        collective = "reduce_scatter" if rs else "allreduce"
        check_algorithm(collective, algorithm)
        name = None if rs or n == 1 else (
            choose(comm, "allgather", count * out.itemsize, "auto") if algorithm == "auto"
            else GATHER_FOR.get(algorithm, "recursive_doubling"))
        return (signed(collective, (layout.counts if rs else count, g.addends), out.dtype, op,
                       f"{kind}+{name or 'none'}"), name and entry("allgather", name))

    key = (kind, rs, count, layout.counts, out.dtype, op.name, algorithm, g.addends)
    sig, gather = call.setup(key, setup)
    tag = call.tag(sig)
    if gather is not None:
        gather = gather.bound(locate(comm, call.state, "allgather", gather.name))
    pool = call.state.pool
    s = scratch(pool, chunk_items(layout.counts[rank], out.dtype))
    recv = pool.take(np.empty(0, out.dtype), direct_items(g, layout, rank, len(parts)))
    counts = pool.take(np.empty(0, np.int64), 0 if held else n)
    args = (comm, parts, out, g, gather, s, recv, counts, local, op.divide, blocks, held)
    return Plan(call, direct_rounds, args, tag, None, (*s, recv, counts))
