"""How a buffer of `count` items is split into N blocks, one per rank.

    count = 10, n = 4:   | 0 0 0 | 1 1 1 | 2 2 | 3 3 |
                         counts = (3, 3, 2, 2), displs = (0, 3, 6, 8)

The first ``count % n`` blocks hold one item more than the others, so block
sizes differ by at most one; blocks may be empty (count < n, or count = 0).
Per-rank counts (``MPI_Reduce_scatter``, ``MPI_Allgatherv``) use the same
class with the counts (and, for ``Allgatherv``, displacements) given.
Every algorithm addresses its data through it.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate


class Blocks:
    """Block `i` of a buffer is ``buf[displs[i] : displs[i] + counts[i]]``."""

    __slots__ = ("counts", "displs", "total", "packed")

    def __init__(self, counts, displs=None):
        counts = tuple(int(c) for c in counts)
        if any(c < 0 for c in counts):
            raise ValueError(f"block counts must be >= 0, got {counts}")
        self.counts = counts
        if displs is None:  # packed: each block starts where the previous one ends
            displs = (0, *accumulate(counts))[:-1] if counts else ()
        self.displs = tuple(int(d) for d in displs)
        if len(self.displs) != len(counts) or any(d < 0 for d in self.displs):
            raise ValueError(f"need one displacement >= 0 per block, got {self.displs}")
        self.total = sum(counts)
        # the blocks tile the buffer with no gaps, in rank order (MPI_Allgather's layout)
        self.packed = self.displs == (0, *accumulate(counts))[:-1] if counts else True

    @classmethod
    @lru_cache(maxsize=256)  # Blocks are immutable: one object per (count, n) in use
    def even(cls, count: int, n: int) -> Blocks:
        """Split `count` items into `n` blocks whose sizes differ by at most one."""
        if n < 1:
            raise ValueError(f"need at least one block, got n={n}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        base, extra = divmod(count, n)
        return cls(base + 1 if i < extra else base for i in range(n))

    @classmethod
    @lru_cache(maxsize=256)
    def equal(cls, count: int, n: int) -> Blocks:
        """`n` blocks of `count` items each (``MPI_Reduce_scatter_block``, ``MPI_Allgather``)."""
        return cls((count,) * n)

    def __len__(self) -> int:
        return len(self.counts)

    def __eq__(self, other) -> bool:
        return isinstance(other, Blocks) and (self.counts, self.displs) == (
            other.counts, other.displs)

    @property
    def extent(self) -> int:
        """Items a buffer needs to hold every block."""
        return max((d + c for d, c in zip(self.displs, self.counts, strict=True)), default=0)

    def __repr__(self) -> str:
        return f"Blocks{self.counts}"

    @property
    def max(self) -> int:
        """Size of the largest block (what a one-block scratch buffer must hold)."""
        return max(self.counts, default=0)

    def start(self, i: int) -> int:
        return self.displs[i] if i < len(self.counts) else self.total

    def view(self, buf, i: int):
        """Block `i` of `buf`, a view."""
        lo = self.displs[i]
        return buf[lo : lo + self.counts[i]]

    def span(self, lo: int, hi: int):
        """Items covered by blocks lo, ..., hi-1, as a slice."""
        return slice(self.start(lo), self.start(hi))


def one_block(blocks: Blocks) -> int:
    """Scratch items for an algorithm that receives one block at a time: the largest."""
    return blocks.max


def one_vector(blocks: Blocks) -> int:
    """Scratch items for an algorithm that receives a whole vector at a time."""
    return blocks.total
