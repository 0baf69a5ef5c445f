"""Timelines: record spans on each rank, write a Chrome trace, draw it as a PNG.

A `Tracer` collects complete events ("ph": "X") on one rank: forward and
backward per layer on the compute row, each bucket's all-reduce from launch to
completion on its own row (buckets in flight overlap, so they cannot share
one), and instants ("ph": "i") on that row: each round it posted (seen at
backward's hooks) and where each of its pieces completed.
`write` gathers every rank's events to rank 0 and writes one JSON file,
one process row per rank, that https://ui.perfetto.dev and chrome://tracing open.

    python -m mpidp.trace plot run.json -o timeline.png [--step K | --all] [--start MS --end MS]

draws the same rows with matplotlib, for documents: by default one step (the
run's middle one; a whole run is thousands of spans too thin to tell apart).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager

from . import files

COMPUTE = 0  # tid of the compute row; bucket k is on row COMM + k
COMM = 1
COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "allreduce": "#55a868",
          "reduce_scatter": "#64b5cd", "wait": "#c44e52", "optimizer": "#8172b3"}
OTHER = "#999999"  # a span of another category


class Tracer:
    """Spans of one rank; times in seconds from `time.perf_counter`."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.events: list[dict] = []
        self.rows = {COMPUTE: "compute"}
        self.reset_clock()

    def reset_clock(self) -> None:
        """Time zero is now (call it right after a barrier to line the ranks up)."""
        self.t0 = time.perf_counter()

    def add(self, name: str, start: float, end: float, cat: str, tid: int = COMPUTE,
            **args) -> None:
        """Record a span from `start` to `end` (perf_counter seconds)."""
        self.events.append({"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
                            "ts": (start - self.t0) * 1e6, "dur": (end - start) * 1e6,
                            "args": args})

    def mark(self, name: str, at: float, cat: str, tid: int = COMPUTE) -> None:
        """Record an instant at `at` (perf_counter seconds), on row `tid`."""
        self.events.append({"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.rank,
                            "tid": tid, "ts": (at - self.t0) * 1e6})

    @contextmanager
    def span(self, name: str, cat: str, tid: int = COMPUTE, **args):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, start, time.perf_counter(), cat, tid, **args)

    def name_row(self, tid: int, name: str) -> None:
        self.rows[tid] = name

    def follow(self, ddp) -> None:
        """Record a `DataParallel`'s steps from now on, through the hooks it already has.

        Forward and backward get a span per layer (``on_layer``, ``on_grad``: the
        time since the previous layer ended); after each synced backward, the
        wait for the buckets and each bucket's all-reduce, on a row of its own (with
        ``piece_mb``, a mark where each piece completed). At each hook of backward
        (``on_grad``, ``on_rows``), a short mark on a bucket's row for each round it
        posted since the previous hook: where its rounds advanced during backward
        (seen at the hooks; with a progress thread they may have advanced earlier).
        """
        for b in ddp.buckets:
            self.name_row(COMM + b.index, f"bucket {b.index} (L{','.join(map(str, b.layers))})")
        last = [0.0]  # when the previous layer ended

        def layer(what: str, i: int) -> None:
            now = time.perf_counter()
            self.add(f"{what} L{i}", last[0], now, what)
            last[0] = now

        forward, on_grad, backward = ddp.forward, ddp.on_grad, ddp.backward
        on_rows = getattr(ddp, "on_rows", None)
        seen: dict = {}  # bucket -> rounds it had posted at the last hook

        def rounds_posted() -> None:
            now = time.perf_counter()
            for b in ddp.buckets:
                if b.request is None:  # (not `not b.request`: a request is falsy once done)
                    continue
                reqs = b.request.started() if hasattr(b.request, "started") else [b.request]
                posted = sum(r.rounds for r in reqs)
                for k in range(seen.get(b.index, 0) + 1, posted + 1):
                    self.mark(f"round {k}", now, "round", tid=COMM + b.index)
                seen[b.index] = posted

        def traced_forward(x):
            last[0] = time.perf_counter()
            return forward(x)

        def traced_on_grad(i: int) -> None:
            layer("backward", i)
            on_grad(i)
            rounds_posted()
            last[0] = time.perf_counter()  # its own progress calls are not layer time

        def traced_on_rows(i: int, stop) -> None:
            on_rows(i, stop)
            rounds_posted()

        def traced_backward(dlogits, timeout=None) -> None:
            last[0] = time.perf_counter()
            seen.clear()
            backward(dlogits, timeout)
            if ddp.timings["exposed_comm"] or any(b.request for b in ddp.buckets):
                t1 = ddp.t_backward + ddp.timings["backward"]
                self.add("wait", t1, t1 + ddp.timings["exposed_comm"], "wait")
            what = getattr(ddp, "bucket_collective", "allreduce")  # ZeRO: reduce_scatter
            for row in ddp.bucket_times():
                t0 = ddp.t_backward
                self.add(f"{what} bucket {row['bucket']}", t0 + row["launch"],
                         t0 + row["complete"], what, tid=COMM + row["bucket"],
                         bytes=row["bytes"])
                for k, (_, done) in enumerate(row.get("pieces", ())):  # (they overlap)
                    self.mark(f"piece {k} done", t0 + done, what, tid=COMM + row["bucket"])

        ddp.forward, ddp.on_grad, ddp.backward = traced_forward, traced_on_grad, traced_backward
        if on_rows is not None:
            ddp.on_rows = traced_on_rows
        ddp.on_layer = lambda i: layer("forward", i)

    def chrome_events(self) -> list[dict]:
        """This rank's events with the metadata that names its process and rows."""
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank}"}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank,
                 "args": {"sort_index": self.rank}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                  "args": {"name": name}} for tid, name in sorted(self.rows.items())]
        return meta + self.events

    def write(self, path: str, comm=None) -> None:
        """Gather every rank's events to rank 0 (mpi4py object gather) and write `path` there,
        atomically (`mpidp.files`: a full disk keeps the old trace, never half of one)."""
        mine = self.chrome_events()
        per_rank = [mine] if comm is None else comm.gather(mine, root=0)
        if comm is None or comm.Get_rank() == 0:
            events = [e for rank_events in per_rank for e in rank_events]
            files.write_json(path, {"traceEvents": events, "displayTimeUnit": "ms"})


class TraceError(Exception):
    """The trace cannot be drawn: missing, not a trace, or the window asked for is not in it."""


def load(path: str) -> list[dict]:
    """The events of a Chrome trace file (TraceError if it is missing or not one)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: not a readable trace ({e})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    return events


def steps(events: list[dict]) -> list[tuple[float, float]]:
    """The training steps of the first rank in the trace, (start, end) in ms: each ends
    with its optimizer span, the next starts there (the first at the rank's first span).
    Empty if the trace has no optimizer spans (a trace of backward passes only)."""
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return []
    pid = min(e["pid"] for e in spans)
    mine = [e for e in spans if e["pid"] == pid]
    ends = sorted((e["ts"] + e["dur"]) / 1e3 for e in mine if e.get("cat") == "optimizer")
    if not ends:
        return []
    starts = [min(e["ts"] for e in mine) / 1e3, *ends[:-1]]
    return list(zip(starts, ends, strict=True))


def window(events: list[dict], start_ms: float | None = None, end_ms: float | None = None,
           step: int | None = None, whole: bool = False) -> tuple[float, float, str]:
    """The window to draw, (lo, hi) in ms, and what it is in words.

    By default one step, the middle one of the run: a whole run is thousands of
    spans, too thin to see (a barcode). `step` (1-based) picks another, `whole` the
    whole run; `start_ms`/`end_ms` set either edge (the other from the choice above).
    """
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise TraceError("no spans in the trace")
    run = (min(e["ts"] for e in spans) / 1e3, max(e["ts"] + e["dur"] for e in spans) / 1e3)
    found = steps(events)
    if step is not None and not 1 <= step <= len(found):
        raise TraceError(f"--step {step}: the trace has {len(found)} steps"
                         + (f" (1 to {len(found)})" if found else ""))
    if whole or not found:
        (lo, hi), what = run, "the whole run"
    else:
        k = len(found) // 2 + 1 if step is None else step
        (lo, hi), what = found[k - 1], f"step {k} of {len(found)}"
    if start_ms is not None or end_ms is not None:
        lo = lo if start_ms is None else start_ms
        hi = hi if end_ms is None else end_ms
        what = f"{lo:g}-{hi:g} ms"
    if not lo < hi:
        raise TraceError(f"an empty window: {lo:g} to {hi:g} ms")
    return lo, hi, what


def plot(path: str, out: str, start_ms: float | None = None, end_ms: float | None = None,
         title: str | None = None, step: int | None = None, whole: bool = False) -> str:
    """Draw a trace as horizontal bars: one band per rank, one row per tid; return what
    window was drawn, in words (see `window`: by default the run's middle step)."""
    events = load(path)
    lo, hi, what = window(events, start_ms, end_ms, step, whole)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    spans = [e for e in spans if e["ts"] / 1e3 < hi and (e["ts"] + e["dur"]) / 1e3 > lo]
    rows = sorted({(e["pid"], e["tid"]) for e in spans} | {k for k in names if k[0] in
                                                           {e["pid"] for e in spans}})
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.5))
    kind = os.path.splitext(out)[1][1:].lower() or "png"  # checked before drawing
    if kind not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
        raise TraceError(f"-o {out}: {kind!r} is not a format it can draw (png, svg, pdf, ...)")
    for e in spans:
        left = max(e["ts"] / 1e3, lo)
        width = min((e["ts"] + e["dur"]) / 1e3, hi) - left
        ax.barh(y_of[(e["pid"], e["tid"])], width, left=left, height=0.8,
                color=COLORS.get(e["cat"], OTHER), edgecolor="black", linewidth=0.3)
    for e in events:  # instants: a piece done, a tick across its row; a round, a short one
        if e.get("ph") == "i" and lo <= e["ts"] / 1e3 <= hi and (e["pid"], e["tid"]) in y_of:
            y, h = y_of[(e["pid"], e["tid"])], 0.2 if e.get("cat") == "round" else 0.4
            ax.plot([e["ts"] / 1e3] * 2, [y - h, y + h], color="black", lw=0.8)
    ax.set_yticks(list(y_of.values()))
    ax.set_yticklabels([f"rank {p} {names.get((p, t), t)}" for p, t in y_of])
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time (ms)")
    # the key: a colour per kind of span drawn, below the axes (never over the bars)
    shown = {e["cat"] if e["cat"] in COLORS else "other" for e in spans}
    kinds = [k for k in [*COLORS, "other"] if k in shown]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS.get(k, OTHER)) for k in kinds]
    fig.legend(handles, kinds, loc="lower center", ncol=max(len(kinds), 1), fontsize=8)
    ax.set_title(title or f"{path}: {what}")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    files.replace(out, lambda f: fig.savefig(f, dpi=120, format=kind))  # atomically
    plt.close(fig)
    return what


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidp.trace")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plot", help="draw a Chrome trace written by --trace as a PNG "
                                    "(by default the run's middle step)")
    p.add_argument("file")
    p.add_argument("-o", "--output", default="timeline.png")
    p.add_argument("--step", type=int, default=None,
                   help="draw step K of the first rank (1-based; default: the middle one)")
    p.add_argument("--all", action="store_true", help="draw the whole run")
    p.add_argument("--start", type=float, default=None, help="window start, ms")
    p.add_argument("--end", type=float, default=None, help="window end, ms")
    p.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        what = plot(args.file, args.output, args.start, args.end, args.title, args.step,
                    args.all)
    except (TraceError, files.WriteError) as e:
        print(f"{parser.prog} plot: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {what} (--step K, --start MS --end MS or --all for another)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
