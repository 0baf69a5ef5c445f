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
import sys
import time
from contextlib import contextmanager

from . import files
from .timeline import COLORS, OTHER, TraceError, load, plot, spans_in, steps, window, windows

__all__ = ["COLORS", "COMM", "COMPUTE", "OTHER", "TraceError", "Tracer", "load", "main", "plot",
           "spans_in", "steps", "window", "windows"]

COMPUTE = 0  # tid of the compute row; bucket k is on row COMM + k
COMM = 1


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
        pieces, a mark where each piece completed). At each hook of backward
        (``on_grad``, ``on_rows``), a short mark on a bucket's row for each round it
        posted since the previous hook: where its rounds advanced during backward
        (seen at the hooks; with a progress thread they may have advanced earlier).
        """
        for b in ddp.buckets:
            self.name_row(COMM + b.index, f"bucket {b.index} (L{','.join(map(str, b.units))})")
        last = [0.0]  # when the previous layer ended

        def layer(what: str, i: int) -> None:
            now = time.perf_counter()
            self.add(f"{what} L{i}", last[0], now, what)
            last[0] = now

        forward, on_grad, on_rows, backward = ddp.forward, ddp.on_grad, ddp.on_rows, ddp.backward
        seen: dict = {}  # bucket -> rounds it had posted at the last hook

        def rounds_posted() -> None:
            now = time.perf_counter()
            for b in ddp.buckets:
                if b.request is None:  # (not `not b.request`: a request is falsy once done)
                    continue
                posted = sum(r.rounds for r in b.request.requests)  # its parts' rounds
                for k in range(seen.get(b.index, 0) + 1, posted + 1):
                    self.mark(f"round {k}", now, "round", tid=COMM + b.index)
                seen[b.index] = posted

        def traced_forward(x, micro_shards: int = 1):
            last[0] = time.perf_counter()
            return forward(x, micro_shards)

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
