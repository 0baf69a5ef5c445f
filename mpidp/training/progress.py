"""A trainer's progress on rank 0: a bar on a terminal, lines under mpiexec, apart from rows."""

from __future__ import annotations

import sys
import time


class Progress:
    """Rank 0's progress through an epoch: a bar on a terminal, lines elsewhere, or none.

    ``mode``: "bar" (or "always") redraws one line of stderr in place, from the epoch's
    first second on; "lines" prints ``epoch 3: step 120/600 (20%), 41.2 steps/s`` to
    stdout every `every` seconds, whole lines that mpiexec passes on (its ranks' output
    is a pipe, never a terminal); "auto" is the bar where stderr is a terminal, lines
    otherwise; "never" nothing. A trainer calls `clear` before printing a row of its
    own, so that no row lands on the bar's line (the bar comes back at the next step).
    """

    def __init__(self, mode: str, total: int, label: str, every: float = 10.0):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.kind = {"bar": "bar", "always": "bar", "lines": "lines"}.get(mode)
        self.total, self.label, self.every = total, label, every
        self.t0 = self.shown = time.perf_counter()
        self.drawn = False

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if self.kind == "lines" and now - self.shown >= self.every:
            rate = done / (now - self.t0) if now > self.t0 else 0.0
            print(f"{self.label}: step {done}/{self.total} ({100 * done // self.total}%), "
                  f"{rate:.1f} steps/s", flush=True)
            self.shown = now
        if self.kind != "bar" or now - self.t0 < 1.0 or now - self.shown < 0.2:
            return
        filled = 30 * done // self.total
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                         f"{done}/{self.total} steps")
        sys.stderr.flush()
        self.shown, self.drawn = now, True

    def clear(self) -> None:
        """Erase the bar, if drawn, so that the next row starts on a clean line."""
        if self.drawn:
            sys.stderr.write("\r" + " " * 72 + "\r")
            sys.stderr.flush()
            self.drawn = False

    close = clear
