"""A predicted step drawn as `python -m mpidp.trace plot` draws a measured one.

The spans of `step.predict(..., timeline=True)` become a Chrome trace of one rank (the
compute row, one row per bucket, each bucket's steps as "round posted" ticks), written
to a temporary file and drawn by `mpidp.timeline.plot`: the same bars, colours and key.
"""

from __future__ import annotations

import os
import tempfile

from mpidp import files, timeline


def trace(row: dict) -> dict:
    """The Chrome trace of a predicted step (times in µs)."""
    rows = ["compute", *dict.fromkeys(r for r, *_ in row["spans"] if r != "compute")]
    tid = {name: k for k, name in enumerate(rows)}
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid[name],
               "args": {"name": name}} for name in rows]
    events += [{"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid[r],
                "ts": start * 1e6, "dur": (end - start) * 1e6, "args": {}}
               for r, name, cat, start, end in row["spans"] if end > start]
    events += [{"name": "round", "cat": "round", "ph": "i", "s": "t", "pid": 0,
                "tid": tid[r], "ts": at * 1e6} for r, at in row["rounds"] if r in tid]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def draw(row: dict, out: str, title: str) -> None:
    """Draw the predicted step `row` into `out` (a PNG; `files.WriteError` if it cannot be)."""
    with tempfile.TemporaryDirectory() as where:
        path = os.path.join(where, "step.json")
        files.write_json(path, trace(row))
        try:
            timeline.plot(path, out, whole=True, title=title)
        except timeline.TraceError as e:
            raise ValueError(str(e)) from None
