"""Where each rank's shard lies in the flat vector of all parameters, and where buckets meet it.

The parameters (and the gradients) are laid end to end in bucket order, last
layer first, as backward produces them: bucket k is the slice
``[start_k, stop_k)``. The flat vector of P items is cut into N shards by the
`Blocks` rules (sizes differ by at most one, any N, any P); rank r owns shard r.
A bucket may straddle shard edges. Example, P = 45, N = 4 (one column per item):

    flat   |W3 b3|    W2 b2     |         W1 b1         |
    bucket |  0  |      1       |           2           |
    shard  |  rank 0   | rank 1   | rank 2   | rank 3   |

    bucket edges 0, 6, 21, 45
    shards Blocks.even(45, 4) = (12, 11, 11, 11), edges 0, 12, 23, 34, 45
    bucket 0 = [0, 6):    counts (6, 0, 0, 0)
    bucket 1 = [6, 21):   counts (6, 9, 0, 0)
    bucket 2 = [21, 45):  counts (0, 2, 11, 11)

A bucket's per-rank counts are the sizes of its pieces inside each shard; they
tile the bucket in rank order, so a reduce-scatter with these counts leaves each
rank exactly its shard's part of the bucket, and an all-gather with them puts
every part back (`MPI_Reduce_scatter` / `MPI_Allgatherv` counts).

Stage 3 (``each=True``) cuts every bucket, one unit each, into N blocks of its
own (FSDP's flat parameter per unit): rank r owns block r of every unit, so
every unit's all-gather is spread over all ranks, and rank r's shard is its
blocks laid end to end in bucket order. The same example:

    bucket 0 = [0, 6):    counts (2, 2, 1, 1)
    bucket 1 = [6, 21):   counts (4, 4, 4, 3)
    bucket 2 = [21, 45):  counts (6, 6, 6, 6)
    shards (12, 12, 11, 10): rank 1's = bucket 0 [2, 4) + bucket 1 [4, 8) + bucket 2 [6, 12)
"""

from __future__ import annotations

import numpy as np

from .. import collectives as mp
from ..arrays import array_module
from ..collectives.algorithms.blocks import Blocks


class Layout:
    """Offsets of the named arrays in the flat vector, the shards, and each bucket's counts.

    Args:
        buckets: `Bucket`s with ``names`` (in the order they lie in the flat vector).
        shapes: name -> shape of every parameter.
        n, rank: the ranks that share the vector, and this one.
        each: cut every bucket into N blocks (stage 3), not the whole vector.
    """

    def __init__(self, buckets, shapes: dict, n: int, rank: int, each: bool = False):
        self.shapes = dict(shapes)
        self.offsets: dict[str, tuple[int, int]] = {}  # name -> [start, stop) in the flat vector
        self.ranges: list[tuple[int, int]] = []  # bucket -> [start, stop)
        at = 0
        for b in buckets:
            start = at
            for name in b.names:
                size = int(np.prod(self.shapes[name], dtype=np.int64))
                self.offsets[name] = (at, at + size)
                at += size
            self.ranges.append((start, at))
        self.total, self.n, self.rank, self.each = at, n, rank, each
        if each:
            self.blocks = [Blocks.even(stop - start, n) for start, stop in self.ranges]
            self.shards = Blocks([sum(b.counts[r] for b in self.blocks) for r in range(n)])
        else:
            self.shards = Blocks.even(at, n)
            self.blocks = [self._cut(start, stop) for start, stop in self.ranges]
        self.lo = self.shards.displs[rank]  # my shard in the vector of shards, rank order
        self.hi = self.lo + self.shards.counts[rank]

    def _cut(self, start: int, stop: int) -> Blocks:
        """Per-rank counts of [start, stop): its overlap with each shard."""
        counts = []
        for r in range(self.n):
            lo = self.shards.displs[r]
            hi = lo + self.shards.counts[r]
            counts.append(max(0, min(hi, stop) - max(lo, start)))
        return Blocks(counts)

    def mine(self, k: int, rank: int | None = None) -> tuple[int, int, int]:
        """Bucket k's part in my shard (or `rank`'s): (offset in bucket, in shard, count)."""
        rank = self.rank if rank is None else rank
        in_bucket = self.blocks[k].displs[rank]
        in_shard = sum(b.counts[rank] for b in self.blocks[:k])  # earlier buckets' parts
        return in_bucket, in_shard, self.blocks[k].counts[rank]

    def shard_of(self, flat):
        """A new array: my shard of the whole flat vector `flat` (my parts, bucket order)."""
        return array_module(flat).concatenate(
            [flat[start + i:start + i + c] for (start, _), (i, _, c)
             in zip(self.ranges, map(self.mine, range(len(self.ranges))), strict=True)])

    def flatten(self, arrays: dict, xp, dtype):
        """One new flat vector holding `arrays` (name -> array) at their offsets."""
        flat = xp.empty(self.total, dtype=dtype)
        for name, (start, stop) in self.offsets.items():
            flat[start:stop] = arrays[name].reshape(-1)
        return flat

    def views(self, flat, names=None, at: int = 0) -> dict:
        """name -> the view of `flat` that holds it, in its shape (no copy).

        `flat` may be a piece of the flat vector that starts at item `at` (a bucket)
        and holds `names`.
        """
        return {name: flat[self.offsets[name][0] - at:self.offsets[name][1] - at]
                .reshape(self.shapes[name]) for name in (names or self.offsets)}

    def gather(self, comm, shard, algorithm: str = "auto"):
        """A new flat vector from every rank's `shard` (collective: an all-gather)."""
        xp = array_module(shard)
        shards = xp.empty(self.total, dtype=shard.dtype)  # rank 0's shard, rank 1's, ...
        shards[self.lo:self.hi] = shard
        mp.allgather(comm, mp.IN_PLACE, shards, self.shards.counts, algorithm=algorithm)
        if not self.each:  # the shards, in rank order, are the flat vector
            return shards
        flat = xp.empty_like(shards)
        for r, lo in enumerate(self.shards.displs):
            for k, (start, _) in enumerate(self.ranges):
                in_bucket, in_shard, count = self.mine(k, r)
                flat[start + in_bucket:start + in_bucket + count] = \
                    shards[lo + in_shard:lo + in_shard + count]
        return flat


def shard_state(layout: Layout, state: dict, xp, dtype) -> dict:
    """An optimizer `state_dict()` by parameter name -> the same for this rank's shard, "flat"."""
    out = {"steps": state["steps"]}
    kinds = sorted({k.split("/", 1)[0] for k in state if k != "steps"})
    for kind in kinds:
        arrays = {name: xp.asarray(state[f"{kind}/{name}"]) for name in layout.offsets}
        out[f"{kind}/flat"] = layout.shard_of(layout.flatten(arrays, xp, dtype))
    return out


def unshard_state(layout: Layout, comm, state: dict, algorithm: str = "auto") -> dict:
    """A shard's optimizer `state_dict()` ("flat") -> the whole one, by name (collective)."""
    out = {"steps": state["steps"]}
    for key in sorted(k for k in state if k != "steps"):  # the same order on every rank
        kind = key.split("/", 1)[0]
        full = layout.gather(comm, state[key], algorithm)
        out.update({f"{kind}/{name}": v for name, v in layout.views(full).items()})
    return out
