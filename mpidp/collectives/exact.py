"""The exact, order-independent sum on the call path: EXACT_SUM, EXACT_AVG, and sums of parts.

    mpidp.allreduce(comm, x, y, op=mpidp.EXACT_SUM)          # y: the same bits on any N
    req = mpidp.iallreduce_parts(comm, [g0, g1, g2], out, addends=12)

Every item is pre-rounded to a grid set by its largest addend (prerounding.py has the
derivation) and the rounded addends are summed exactly. Two paths, chosen from the
number of addends and ranks alone (`exact_direct.takes_direct`), give the same bits:

- the direct path (up to three addends a rank on average, EXACT_SUM's op always):
  block j of every addend goes raw to rank j, which holds all the addends of its
  items and sums them there (this module's `exact_rounds` on one rank, a chunk at a
  time); the chosen algorithm all-gathers the sums. SUM's bytes with one addend a
  rank (exact_direct.py).
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

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .algorithms import Algorithm, entry
from .algorithms.averaging import mean
from .algorithms.blocks import Blocks
from .algorithms.ops import MAX, SUM, Op
from .algorithms.prerounding import (
    Grid,
    _range,
    extremes,
    finish,
    from_words,
    grid,
    magics,
    max_codes,
    special_values,
    specials,
    to_words,
)
from .algorithms.rounds import Rounds
from .checks import check_algorithm
from .cost import choose
from .exact_direct import chunk_items, direct_items, direct_rounds, takes_direct
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


class Scratch(NamedTuple):
    """Pooled arrays of one exact collective of `count` items."""

    code: object  # count, the code dtype (n <= 2: none)
    code_tmp: object  # the MAX algorithm's tmp, code dtype
    tmp16: object  # 2·count, uint16
    words: object  # count·words of g.word: all-reduce [W1 | W2], reduce-scatter W1 W2 W1 ...
    words_tmp: object  # the SUM algorithm's tmp, word dtype
    m1: object  # count, float64: the magic constants of the two grids
    m2: object
    y: object  # count, float64: a word of the second, third ... part


def scratch_for(pool, g: Grid, count: int, code_items: int, word_items: int) -> Scratch:
    def take(dt, items):
        return pool.take(np.empty(0, dt), items)

    grid_items = 0 if g.plain else count
    return Scratch(take(g.code, grid_items), take(g.code, 0 if g.plain else code_items),
                   take(np.uint16, 2 * grid_items), take(g.word, count * g.words),
                   take(g.word, word_items), take(np.float64, grid_items),
                   take(np.float64, grid_items if g.words == 2 else 0),
                   take(np.float64, grid_items))


def _chunks(count: int, dtype):
    """(start, stop) of the chunks (`exact_direct.CHUNK` bytes of dtype) over `count` items."""
    step = max(chunk_items(count, dtype), 1)
    return ((a, min(a + step, count)) for a in range(0, count, step))


def _words(W, g: Grid, interleaved: bool, lo: int, hi: int):
    """Items lo..hi of word 1 and word 2 (None: one word) as views of W."""
    if g.words == 1:
        return W[lo:hi], None
    if interleaved:
        return W[2 * lo : 2 * hi : 2], W[2 * lo + 1 : 2 * hi : 2]
    count = W.size // 2
    return W[lo:hi], W[count + lo : count + hi]


def exact_rounds(comm, parts, out, g: Grid, code_algo, word_algo, s: Scratch,
                 average: bool = False, reduce_scatter: Blocks | None = None) -> Rounds:
    """The words path's three passes as one generator of rounds (prerounding.py derives
    them); on a comm of one rank with collectives that send nothing, the direct path's
    local sum.

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
        with np.errstate(over="ignore"):  # beyond the range: ±inf, the fixed rule
            for x in parts[1:]:
                np.add(W, x, out=W)
    else:
        code = s.code
        for a, b in _chunks(count, g.dtype):  # a chunk of every addend at a time, in the cache
            max_codes([x[a:b] for x in parts], code[a:b], s.tmp16[: 2 * (b - a)])
        yield from code_algo(comm, code, Blocks.even(count, n), MAX, s.code_tmp)
        w1, w2 = _words(W, g, rs, 0, count)
        m2 = s.m2 if g.words == 2 else None
        scaled = magics(code, g, s.m1, m2, s.tmp16)
        if not parts:
            W[...] = 0
        with np.errstate(invalid="ignore", over="ignore"):
            for a, b in _chunks(count, g.dtype):
                for i, x in enumerate(parts):
                    to_words(x[a:b], s.m1[a:b], m2 if m2 is None else m2[a:b], w1[a:b],
                             w2 if w2 is None else w2[a:b], s.y[: b - a], i == 0)
            if scaled.size:
                extremes(parts, scaled, code, g, w1, w2)
        special = specials(parts, code, w1, w2, g)
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
    w1, w2 = _words(W, g, rs, lo, hi)
    code = code[lo:hi]
    special = special[(special >= lo) & (special < hi)] - lo
    scaled = scaled[(scaled >= lo) & (scaled < hi)] - lo
    values = special_values(w1, w2, special) if special.size else None
    if average and g.addends > 1:  # V/n from the words, rounded once (averaging.py)
        mean(w1, w2, out, g.addends, lambda i: _exact(w1, w2, code, g, i), scaled)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            from_words(w1, w2, out, code, g, scaled)
    finish(code, out, g, special, values)


def _exact(w1, w2, code, g: Grid, i: int) -> Fraction:
    """Item i's summed words as the exact V (scaled ones times 2^e, as `from_words`)."""
    v = Fraction(float(w1[i])) + (0 if w2 is None else Fraction(float(w2[i])))
    if g.words == 2 and not _range(g)[0] <= code[i] <= _range(g)[1]:
        v *= Fraction(2) ** (max(int(code[i]), 1) - (g.bias - 1))
    return v


# ------------------------------------------------------------ the plans


def plan_exact(call: Call, parts: list, out, op: Op, algorithm: str, addends: int,
               blocks: Blocks | None = None, held: int | None = None) -> Plan:
    """The plan of an exact all-reduce (or, with `blocks`, reduce-scatter) of `parts`.

    Args:
        parts: this rank's addends, flat arrays of the vector's size.
        out: the result: the vector (all-reduce) or this rank's block (reduce-scatter).
        algorithm: for the SUM pass, and the MAX pass (a reduce-scatter's: `CODE_FOR`).
        addends: over all ranks, the same on every rank.
        held: (the sums of parts) the parts this rank holds: with MPIDP_DEBUG the ranks
            check that they add up to `addends`.
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

    if call.debug:  # the arguments as passed, before auto's (collective) set-up
        collective = "reduce_scatter" if rs else "allreduce"
        check_algorithm(collective, algorithm)
        call.agree(collective, count=blocks.counts if rs else count, dtype=out.dtype,
                   op=op.name, algorithm=algorithm, addends=addends)
        if held is not None:
            call.agree_total(collective, held, addends)
    if takes_direct(g, comm.Get_size()):
        return _plan_direct(call, parts, out, g, op, algorithm, blocks, known=held is None)
    key = ("exact", rs, count, blocks and blocks.counts, out.dtype, op.name, algorithm, addends)
    s = call.setup(key, setup)
    tag = call.tag(s.signed)
    code_algo = s.code.bound(locate(comm, call.state, "allreduce", s.code.name))
    word_algo = s.word.bound(locate(comm, call.state, "reduce_scatter" if rs else "allreduce",
                                    s.word.name))
    scratch = scratch_for(call.state.pool, g, count, *s.scratch)
    args = (comm, parts, out, g, code_algo, word_algo, scratch, op.divide, blocks)
    return Plan(call, exact_rounds, args, tag, None, tuple(scratch))


def _plan_direct(call: Call, parts: list, out, g: Grid, op: Op, algorithm: str,
                 blocks: Blocks | None, known: bool) -> Plan:
    """The plan of the direct path (`exact_direct`): raw addends to their items' owners,
    the local grid sum there, and (all-reduce) the all-gather of the sums."""
    comm, n, rank = call.comm, call.comm.Get_size(), call.comm.Get_rank()
    rs = blocks is not None
    count = blocks.total if rs else out.size
    layout = blocks if rs else Blocks.even(count, n)

    def setup() -> tuple[Signed, Algorithm | None]:
        collective = "reduce_scatter" if rs else "allreduce"
        check_algorithm(collective, algorithm)
        name = None if rs else (
            choose(comm, "allgather", count * out.itemsize, "auto") if algorithm == "auto"
            else GATHER_FOR.get(algorithm, "recursive_doubling"))
        return (signed(collective, (layout.counts if rs else count, g.addends), out.dtype, op,
                       f"direct+{name or 'none'}"), name and entry("allgather", name))

    key = ("exact direct", rs, count, layout.counts, out.dtype, op.name, algorithm, g.addends)
    sig, gather = call.setup(key, setup)
    tag = call.tag(sig)
    if gather is not None:
        gather = gather.bound(locate(comm, call.state, "allgather", gather.name))
    pool = call.state.pool
    s = scratch_for(pool, g, chunk_items(layout.counts[rank], out.dtype), 0, 0)
    recv = pool.take(np.empty(0, out.dtype), direct_items(g, layout, rank, len(parts)))
    counts = pool.take(np.empty(0, np.int64), 0 if known else n)
    args = (comm, parts, out, g, gather, s, recv, counts, exact_rounds, op.divide, blocks, known)
    return Plan(call, direct_rounds, args, tag, None, (*s, recv, counts))
