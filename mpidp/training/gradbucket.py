"""What a communication hook gets and returns (the protocol is `hooks.py`'s).

`GradBucket` is a bucket as its hook sees it; `Steps` turns a generator that yields lists
of requests into one request, so that a hook reads as its steps.
"""

from __future__ import annotations

import time
from collections.abc import Generator

import numpy as np

from ..collectives import testall

# the hooks' own point-to-point tags, below mpidp's TAG_BASE: HOOK_TAG + 2·bucket + phase.
# DataParallel's duplicate of the communicator carries nothing else; a comm-like object
# used as given must not carry messages of the user's with these tags
HOOK_TAG, HOOK_TAGS = 0x4000, 0x0400


def hook_tag(index: int, phase: int) -> int:
    """Bucket `index`'s tag for a hook's exchange `phase` (0 or 1)."""
    return HOOK_TAG + 2 * (index % (HOOK_TAGS // 2)) + phase


class GradBucket:
    """What a hook gets of a bucket (see the module's protocol)."""

    __slots__ = ("index", "buffer", "params", "algorithm")

    def __init__(self, index: int, buffer, params: list[tuple[str, int, tuple]],
                 algorithm="auto"):
        self.index, self.buffer, self.params, self.algorithm = index, buffer, params, algorithm

    def view(self, k: int):
        """Gradient k of the bucket, shaped: a view of ``buffer``."""
        _, offset, shape = self.params[k]
        return self.buffer[offset : offset + int(np.prod(shape))].reshape(shape)


class Steps:
    """A request made of steps: `steps` yields a list of requests, and resumes (doing the
    step's local work) once all of them are complete; done when the generator returns."""

    def __init__(self, steps: Generator[list, None, None]):
        self._steps, self.rounds, self.done, self.completed_at = steps, 0, False, None
        self._current: list = []
        self._next()

    def _next(self) -> None:
        self._current = next(self._steps, None)
        if self._current is None:
            self.done, self.completed_at = True, time.perf_counter()
        else:
            self.rounds += 1

    def Test(self, status=None) -> bool:  # noqa: N802 - as a request's, for mp.waitall
        while not self.done and testall(self._current):
            self._next()
        return self.done
