"""Remembered answers, at most so many: the call path's one cache.

The call path remembers what a question's answer was (a signature's setup, `auto`'s
choice, a signature's number, the kinds of arguments already checked) so that a
repeated call costs one dict lookup. A steady program asks the same few questions;
one that asks ever new ones (a new size every call) must not grow without end. So
a `Bounded` that is full starts again: simpler than evicting the oldest, and a
steady program refills it at once.
"""

from __future__ import annotations

LIMIT = 4096  # answers kept: far more than the bucket sizes of any trainer


class Bounded(dict):
    """A dict of remembered answers holding at most `limit` of them (full: cleared)."""

    __slots__ = ("limit",)

    def __init__(self, items=(), limit: int = LIMIT):
        super().__init__(items)
        self.limit = limit

    def remember(self, key, value):
        """Keep `value` as the answer to `key` and return it; first start again if full."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
