"""The ordered sum's chain: the running sum goes down the ranks, rank 0 to rank N-1.

Rank 0 adds its parts, left to right; rank 1 receives that sum and adds its parts
to it, in order; and so on to the last rank, which divides (the average), rounds to
the dtype and hands the result back: a broadcast (all-reduce), or block j to rank j
(reduce-scatter). Three ranks, five parts:

        rank 0: s = a0 + a1  --s-->  rank 1: s = s + b0 + b1  --s-->  rank 2: s = s + c0
        rank 2: out = s / 5,  then  out --> ranks 0 and 1   (the chosen broadcast)

Each addition is one rank's loop over the parts would make, in the same order, so
the bits are the direct path's (ordered.py). The vector goes down in S segments:
rank r adds its parts to segment i while segment i+1 comes from rank r-1 and segment
i-1 goes on to rank r+1, and the pipeline fills in N-1 steps. A rank with no parts
passes the sum on as it came; rank 0 with none starts it at -0.0, which leaves the
first addend as it is (-0.0 + x is x, bit for bit, -0.0 and +0.0 included).

Cost (G bytes of the dtype, W of the wider dtype the sum travels in, h parts on the
busiest rank, B the broadcast's cost): (N-2+S)·(α + W·β/S) + (N-1+S)·h·G·γ/S + B(G),
and (N-1)·α more to swap the counts unless the caller passes them. Every rank sends
the sum once, W bytes, however many parts it holds, where the direct path sends
h·G(N-1)/N in h·(N-1) messages: the chain is the path of ranks holding several
parts, and costs hops as N grows. `route` weighs the two with the comm's model.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .algorithms.blocks import Blocks
from .algorithms.rounds import Recv, Rounds, Send
from .cost import Model, predict
from .exact_direct import swap_held

SEGMENT = 4096  # bytes of a segment at least: shorter ones cost more rounds than they save


def first(acc, parts) -> None:
    """acc = the left fold of `parts` (rank 0: the sum starts here), -0.0 if there are none."""
    if len(parts) < 2:
        np.copyto(acc, parts[0] if parts else -0.0)
        return
    with np.errstate(over="ignore", invalid="ignore"):  # (in acc's dtype: float16's in float32)
        np.add(parts[0], parts[1], out=acc, dtype=acc.dtype)
    add(acc, parts[2:])


def add(acc, parts) -> None:
    """acc = acc + parts[0] + parts[1] + ..., one rounding per addition, in `acc`'s dtype."""
    with np.errstate(over="ignore", invalid="ignore"):  # ±inf and NaN: IEEE's, kept
        for x in parts:
            np.add(acc, x, out=acc)


def finish(acc, out, addends: int, average: bool) -> None:
    """out = acc (divided by `addends` for the average) in out's dtype, rounded there once,
    its NaNs the canonical quiet NaN whatever payload came through."""
    into = out if out.dtype == acc.dtype else acc  # divided in acc's dtype, then rounded
    with np.errstate(over="ignore", invalid="ignore"):
        if not average or addends < 2:
            into = acc
        elif addends & (addends - 1) == 0:  # P a power of two: x * (1/P) is x / P exactly
            np.multiply(acc, 1.0 / addends, out=into)  # (one rounding of the same number)
        else:
            np.true_divide(acc, addends, out=into)
        if into is not out:
            np.copyto(out, into, casting="same_kind")
    if np.isnan(np.maximum.reduce(out, initial=0)):  # one read: NaN if any item is NaN
        out[np.isnan(out)] = np.nan


def chain_rounds(comm, parts, out, addends: int, acc, cuts: Blocks, bcast, counts,
                 held: list[int] | None, average: bool = False,
                 reduce_scatter: Blocks | None = None, whole=None) -> Rounds:
    """The chain as one generator of rounds.

    Args:
        parts: this rank's addends (flat, the whole vector each); may include `out`.
        out: the result (all-reduce), or with `reduce_scatter` this rank's block.
        acc: the running sum, the whole vector in the wider dtype (`ordered.wide`).
        cuts: the segments of the vector, S blocks.
        bcast: the broadcast generator ``(comm, buf, root)`` (all-reduce only).
        counts: N int64, scratch to swap the parts' numbers when `held` is None.
        whole: (reduce-scatter, last rank) the whole result, before it is cut up.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    if held is None:  # checks that the ranks' parts add up to `addends`, on every rank
        yield from swap_held(comm, len(parts), counts, addends)
    last, S = n - 1, len(cuts)
    result = out if reduce_scatter is None else whole
    for i in range(S):  # segment i: from rank - 1, add my parts, (i+1: on to rank + 1)
        round_ = [Recv(cuts.view(acc, i), rank - 1)] if rank and cuts.counts[i] else []
        if i and rank < last and cuts.counts[i - 1]:
            round_.append(Send(cuts.view(acc, i - 1), rank + 1))
        if round_:
            yield round_
        mine = [cuts.view(x, i) for x in parts]
        (add if rank else first)(cuts.view(acc, i), mine)
        if rank == last:
            finish(cuts.view(acc, i), cuts.view(result, i), addends, average)
    if rank < last and cuts.counts[S - 1]:
        yield [Send(cuts.view(acc, S - 1), rank + 1)]
    if n == 1:
        if reduce_scatter is not None:
            out[...] = whole
        return
    if reduce_scatter is None:
        yield from bcast(comm, out, last)
    elif rank == last:  # block j to rank j
        yield [Send(reduce_scatter.view(whole, j), j) for j in range(last)
               if reduce_scatter.counts[j]]
        out[...] = reduce_scatter.view(whole, last)
    elif out.size:
        yield [Recv(out, last)]


class Route(NamedTuple):
    """Which path an ordered sum takes (`route`), and the chain's segments."""

    chain: bool
    segments: int = 1


def route(m: Model, n: int, count: int, itemsize: int, wide: int, addends: int, h: int,
          gather: str | None, bcast: str | None) -> Route:
    """The chain or the direct path, whichever `m` predicts the faster (both give the same
    bits), with the chain's number of segments S that minimizes its time.

    Both cost lines count α per message, as the model is calibrated (a ring round is one
    send and one receive): the direct path sends h·(N-1) messages, one per part and peer,
    and h·G(N-1)/N bytes; its owners add P addends over G/N. The chain sends S messages
    of W/S bytes down N-1 links, N-2+S of them on its critical path, and adds h parts
    over G on each of N ranks, N-1+S segments' worth on its critical path:

        direct = h(N-1)·α + h·G(N-1)/N·β + P·G/N·γ + A(G)
        chain  = (N-2+S)·(α + W·β/S) + (N-1+S)·h·G·γ/S + B(G)

    Measured on 2 ranks, with γ this vector's adds' rate (`ordered._route`,
    docs/benchmarks-notes.md): right at 4 KB with 4 parts a rank and 69 KB with 2; at
    69 KB with 4 the chain, right in the MLP trainer's step (1.42x its default step
    against 1.70x) though 25% slower alone after a barrier; wrong at 4 MiB with 4 (the
    chain in 8 segments, 15% slower than the direct path).

    Args:
        count, itemsize, wide: the vector's items, the dtype's bytes and the sum's.
        h: the parts on the busiest rank (the average, rounded up, where not known).
        gather, bcast: the direct path's all-gather and the chain's broadcast (None:
            a reduce-scatter, which has neither: its chain sends block j to rank j).
    """
    if n == 1 or count == 0:
        return Route(False)
    a, b, c = m.alpha, m.beta, m.gamma
    G, W = count * itemsize, count * wide
    direct = (h * (n - 1) * a + h * G * (n - 1) / n * b + addends * G / n * c
              + (predict(m, "allgather", gather, G, n) if gather else 0.0))
    most = max(1, G // SEGMENT)
    best = math.sqrt(((n - 2) * W * b + (n - 1) * h * G * c) / a) if a else most
    S = max(1, min(most, round(best)))
    chain = ((n - 2 + S) * (a + W * b / S) + (n - 1 + S) * h * G * c / S
             + (predict(m, "bcast", bcast, G, n) if bcast else a + G * (n - 1) / n * b))
    return Route(chain < direct, S)
