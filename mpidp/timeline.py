"""Drawing a Chrome trace (`mpidp.trace`'s files) as a PNG: which window, which spans.

`python -m mpidp.trace plot` draws one step by default, the middle one: each rank's own
step K (ranks run out of phase), so the window spans them all and each rank shows its
step only. `mpidp.trace` re-exports these names.
"""

from __future__ import annotations

import os

from . import files, untrusted

MAX_TRACE = 1 << 30  # bytes: a trace of a long run is tens of MB

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "allreduce": "#55a868",
          "reduce_scatter": "#64b5cd", "wait": "#c44e52", "optimizer": "#da8bc3"}
OTHER = "#999999"  # a span of another category


class TraceError(Exception):
    """The trace cannot be drawn: missing, not a trace, or the window asked for is not in it."""


def load(path: str) -> list[dict]:
    """The events of a Chrome trace file (TraceError if it is missing or not one)."""
    try:
        data = untrusted.read_json(path, MAX_TRACE)  # a FIFO is refused, not waited on
    except untrusted.InputError as e:
        reason = str(e).removeprefix(f"{path}: ")
        raise TraceError(f"{path}: " + (reason if reason == "no such file"
                                        else f"not a readable trace ({reason})")) from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    return events


def steps(events: list[dict], pid: int | None = None) -> list[tuple[float, float]]:
    """The training steps of rank `pid` (default: the first rank in the trace), (start,
    end) in ms: each ends with its optimizer span, the next starts there (the first at the
    rank's first span). Empty if it has no optimizer spans (a trace of backward passes)."""
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return []
    pid = min(e["pid"] for e in spans) if pid is None else pid
    mine = [e for e in spans if e["pid"] == pid]
    ends = sorted((e["ts"] + e["dur"]) / 1e3 for e in mine if e.get("cat") == "optimizer")
    if not ends:
        return []
    starts = [min(e["ts"] for e in mine) / 1e3, *ends[:-1]]
    return list(zip(starts, ends, strict=True))


def windows(events: list[dict], start_ms: float | None = None, end_ms: float | None = None,
            step: int | None = None, whole: bool = False):
    """(lo, hi, what, bounds): the window to draw in ms, what it is in words, and each
    rank's own part of it, {pid: (start, end)} (None: the whole window for every rank).

    By default one step, the middle one of the first rank's steps: a whole run is
    thousands of spans, too thin to see (a barcode). Ranks run out of phase, so step K
    is each rank's own K-th step, and the window spans them all; each rank shows only its
    own (not the end of its step K-1 nor the start of K+1). `step` (1-based) picks
    another, `whole` the whole run; `start_ms`/`end_ms` set either edge (the other from
    the choice above), one interval for every rank.
    """
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise TraceError("no spans in the trace")
    run = (min(e["ts"] for e in spans) / 1e3, max(e["ts"] + e["dur"] for e in spans) / 1e3)
    found = steps(events)
    if step is not None and not 1 <= step <= len(found):
        raise TraceError(f"--step {step}: the trace has {len(found)} steps"
                         + (f" (1 to {len(found)})" if found else ""))
    bounds = None
    if whole or not found:
        (lo, hi), what = run, "the whole run"
    else:
        k = len(found) // 2 + 1 if step is None else step
        every = {pid: steps(events, pid) for pid in sorted({e["pid"] for e in spans})}
        bounds = {pid: mine[k - 1] for pid, mine in every.items() if len(mine) >= k}
        lo, hi = min(b[0] for b in bounds.values()), max(b[1] for b in bounds.values())
        what = f"step {k} of {len(found)}"
    if start_ms is not None or end_ms is not None:
        lo = lo if start_ms is None else start_ms
        hi = hi if end_ms is None else end_ms
        what, bounds = f"{lo:g}-{hi:g} ms", None
    if not lo < hi:
        raise TraceError(f"an empty window: {lo:g} to {hi:g} ms")
    return lo, hi, what, bounds


def window(events: list[dict], *args, **kwargs) -> tuple[float, float, str]:
    """The window to draw, (lo, hi) in ms, and what it is in words (`windows`)."""
    return windows(events, *args, **kwargs)[:3]


def spans_in(events: list[dict], lo: float, hi: float, bounds: dict | None = None,
             ph: str = "X") -> list[dict]:
    """The events of kind `ph` (spans, or "i": instants) that fall in the window: in each
    rank's own part of it where `bounds` gives one (`windows`)."""
    def part(e):
        return bounds.get(e["pid"]) if bounds is not None else (lo, hi)

    found = []
    for e in events:
        if e.get("ph") != ph or part(e) is None:
            continue
        a, b = part(e)
        start, end = e["ts"] / 1e3, (e["ts"] + e.get("dur", 0)) / 1e3
        if (start < b - EPS and end > a + EPS) if ph == "X" else a <= start <= b:
            found.append(e)
    return found


EPS = 1e-6  # ms: spans that only touch the window's edge (rounding of the times) are outside

# the instants drawn as ticks across their row: (what the key says, tick half-height, colour)
TICKS = {"round": ("round posted", 0.2, "#555555"), "piece": ("piece done", 0.4, "black")}


def plot(path: str, out: str, start_ms: float | None = None, end_ms: float | None = None,
         title: str | None = None, step: int | None = None, whole: bool = False) -> str:
    """Draw a trace as horizontal bars: one band per rank, one row per tid; return what
    window was drawn, in words (see `window`: by default the run's middle step)."""
    events = load(path)
    lo, hi, what, bounds = windows(events, start_ms, end_ms, step, whole)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = spans_in(events, lo, hi, bounds)
    rows = sorted({(e["pid"], e["tid"]) for e in spans} | {k for k in names if k[0] in
                                                           {e["pid"] for e in spans}})
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.5))
    fmt = os.path.splitext(out)[1][1:].lower() or "png"  # checked before drawing
    if fmt not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
        raise TraceError(f"-o {out}: {fmt!r} is not a format it can draw (png, svg, pdf, ...)")
    for e in spans:
        a, b = bounds.get(e["pid"]) if bounds is not None else (lo, hi)
        left = max(e["ts"] / 1e3, a)
        width = min((e["ts"] + e["dur"]) / 1e3, b) - left
        ax.barh(y_of[(e["pid"], e["tid"])], width, left=left, height=0.8,
                color=COLORS.get(e["cat"], OTHER), edgecolor="black", linewidth=0.3)
    keyed_ticks = set()
    for e in spans_in(events, lo, hi, bounds, ph="i"):  # a round posted, a piece done
        if (e["pid"], e["tid"]) in y_of:
            kind = "round" if e.get("cat") == "round" else "piece"
            label, h, tick = TICKS[kind]
            y = y_of[(e["pid"], e["tid"])]
            ax.plot([e["ts"] / 1e3] * 2, [y - h, y + h], color=tick, lw=0.8,
                    label="_tick" if kind in keyed_ticks else label)
            keyed_ticks.add(kind)
    ax.set_yticks(list(y_of.values()))
    ax.set_yticklabels([f"rank {p} {names.get((p, t), t)}" for p, t in y_of])
    ax.set_xlim(lo, hi)
    ax.set_xlabel("time (ms)")
    # the key: a colour per kind of span drawn, and the ticks, below the axes (never over
    # the bars)
    shown = {e["cat"] if e["cat"] in COLORS else "other" for e in spans}
    kinds = [k for k in [*COLORS, "other"] if k in shown]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS.get(k, OTHER)) for k in kinds]
    for kind in (k for k in TICKS if k in keyed_ticks):
        label, _, tick = TICKS[kind]
        handles.append(matplotlib.lines.Line2D([], [], color=tick, lw=0.8, marker="|",
                                               markersize=8, linestyle="none"))
        kinds.append(label)
    fig.legend(handles, kinds, loc="lower center", ncol=max(len(kinds), 1), fontsize=8)
    ax.set_title(title or f"{path}: {what}")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    files.replace(out, lambda f: fig.savefig(f, dpi=120, format=fmt))  # atomically
    plt.close(fig)
    return what
