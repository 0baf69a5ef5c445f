"""What the benchmarks print and write: sizes, table rows, JSON, CSV and plots.

Shared by ``python -m mpidp.bench collectives``, ``calibrate`` and the report
generator (`tools/report.py`), so that every table names sizes and
placements alike.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform

from .. import files, untrusted
from ..units import human, parse_size  # noqa: F401 - the bench's commands take them from here

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast")
TITLES = {"allreduce": "all-reduce", "reduce_scatter": "reduce-scatter (block)",
          "allgather": "all-gather", "bcast": "broadcast"}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw: the fraction of the data each rank's link must carry."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "allgather"):
        return (n - 1) / n
    return 1.0


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` for the bench's commands: the description as written (its command lines
    and tables keep their lines), and each option's default after its help."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text \
                and action.option_strings:
            text += " (default: %(default)s)"
        return text


def placement(inplace: bool | None) -> str:
    return {False: "out-of-place", True: "in-place", None: "single buffer"}[inplace]


def header() -> str:
    return (f"{'size':>10s} {'count':>10s} {'algorithm':<38s} {'time(us)':>10s} "
            f"{'min(us)':>10s} {'algbw':>7s} {'busbw':>7s} {'vs native':>9s} {'#wrong':>6s}")


def label(row: dict) -> str:
    """'auto (ring)' for auto, the name otherwise; ' persistent' for the ``*_init`` forms."""
    name = row["algorithm"]
    if name == "auto" and row.get("resolved"):
        name = f"auto ({row['resolved']})"
    return name + (" persistent" if row.get("persistent") else "")


def format_row(row: dict) -> str:
    speedup = f"{row['speedup']:8.2f}x" if row.get("speedup") else f"{'-':>9s}"
    return (f"{human(row['bytes']):>10s} {row['count']:>10d} {label(row):<38s} "
            f"{row['time_us']:10.1f} {row['min_us']:10.1f} {row['algbw_gbps']:7.3f} "
            f"{row['busbw_gbps']:7.3f} {speedup} {row['wrong']:6d}")


def format_memory(rows: list[dict]) -> list[str]:
    lines = ["", "# memory at the largest size: peak new allocation during one call "
             "(tracemalloc, max over ranks)",
             f"{'collective':<16s} {'placement':<14s} {'algorithm':<30s} {'size':>10s} "
             f"{'first call':>12s} {'steady':>12s}"]
    for r in rows:
        if "mem_first_bytes" in r:
            lines.append(f"{r['collective']:<16s} {placement(r['inplace']):<14s} "
                         f"{label(r):<30s} {human(r['bytes']):>10s} "
                         f"{human(r['mem_first_bytes']):>12s} {human(r['mem_steady_bytes']):>12s}")
    return lines


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


MAX_RESULT = 256 << 20  # bytes of one benchmark's JSON


def read_json(path: str):
    """A benchmark's JSON output, read by the one reader (`mpidp.untrusted`: a FIFO, a huge
    or deeply nested file is an InputError, a ValueError, naming the file)."""
    return untrusted.read_json(path, MAX_RESULT)


def write_json(path: str, meta: dict, rows: list[dict]) -> None:
    """Metadata, then ``rows``: one row a line (readable diffs), floats to 6 digits."""
    def short(row: dict) -> dict:
        return {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in row.items()}

    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in meta.items()]
    body = ",\n".join("  " + json.dumps(short(r)) for r in rows)
    files.write_text(path, "{\n" + "\n".join(lines) + '\n "rows": [\n' + body + "\n ]\n}\n")


CSV_FIELDS = ("collective", "algorithm", "resolved", "inplace", "bytes", "count", "dtype",
              "ranks", "iters", "warmup", "time_us", "min_us", "algbw_gbps", "busbw_gbps",
              "speedup", "wrong", "mem_first_bytes", "mem_steady_bytes")


def write_csv(path: str, rows: list[dict]) -> None:
    def write(f) -> None:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    files.replace(path, write, text=True)


def series(row: dict) -> str:
    """A row's line in the plots: 'auto persistent' apart from 'auto'."""
    return row["algorithm"] + (" persistent" if row.get("persistent") else "")


# One colour per series, the same in every panel. The MPI library is black (dashed; its
# persistent calls grey, dotted); the all-reduce panels hold twelve series, so tab10 is
# not enough alone. A series met in no panel of the all-reduce's (halving, broadcast) takes
# a colour of one that is absent where it appears.
SERIES_COLORS = {
    "native": "black", "native persistent": "#7f7f7f",
    "ring": "C0", "rabenseifner": "C1", "recursive_doubling": "C2", "auto": "C3",
    "direct": "C4", "rabenseifner_article": "C5", "hierarchical": "C6", "naive": "navy",
    "auto persistent": "C8", "gloo": "C9",
    "recursive_halving": "C1", "binomial": "C4", "scatter_allgather": "C5",
}
SPARE_COLORS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "navy", "C8", "C9", "C7")
LINESTYLES = {"native": "--", "native persistent": ":"}


def colors(names) -> dict[str, str]:
    """A colour for each series of one panel: its own, or (a name not listed in
    SERIES_COLORS) the first spare one no other series of the panel has."""
    found = {n: SERIES_COLORS[n] for n in names if n in SERIES_COLORS}
    for n in names:
        if n not in found:
            found[n] = next((c for c in SPARE_COLORS if c not in found.values()), "C7")
    return found


def plot(rows: list[dict], meta: dict, path: str) -> None:
    """One row of subplots per collective: busbw and latency against size, native dashed;
    each panel's key beside it, off the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    collectives = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
    fig, axes = plt.subplots(len(collectives), 2, figsize=(15, 3.3 * len(collectives)),
                             squeeze=False)
    for (ax_bw, ax_t), collective in zip(axes, collectives, strict=True):
        mine = [r for r in rows if r["collective"] == collective]
        place = False if any(r["inplace"] is False for r in mine) else mine[0]["inplace"]
        mine = [r for r in mine if r["inplace"] is place]
        names = list(dict.fromkeys(series(r) for r in mine))
        color = colors(names)
        for algorithm in names:
            line = [r for r in mine if series(r) == algorithm]
            x = [r["bytes"] for r in line]
            style = {"color": color[algorithm], "linestyle": LINESTYLES.get(algorithm, "-")}
            ax_bw.plot(x, [r["busbw_gbps"] for r in line], marker=".", label=algorithm, **style)
            ax_t.plot(x, [r["time_us"] for r in line], marker=".", label=algorithm, **style)
        title = f"{TITLES[collective]}, {placement(place)}, {meta.get('ranks')} ranks"
        ax_bw.set(title=title, xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)")
        ax_t.set(title=title, xscale="log", yscale="log", xlabel="size (bytes)",
                 ylabel="time (µs, median)")
        for ax in (ax_bw, ax_t):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(LogLocator(base=4))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0.0)
    fig.suptitle(f"mpidp collectives vs {meta.get('mpi_library_short', 'MPI')} "
                 f"({meta.get('dtype')}, {meta.get('cpu')})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    files.replace(path, lambda f: fig.savefig(f, dpi=72, format=figure_format(path)))
    plt.close(fig)


def figure_format(path: str) -> str:
    """The image format `path`'s name asks for (png where it names none)."""
    return os.path.splitext(path)[1][1:].lower() or "png"


def replace_marked(path: str, begin: str, end: str, lines: list[str]) -> bool:
    """Put `lines` between the markers `begin` and `end` of the file at `path`."""
    with open(path) as f:
        text = f.read()
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    files.write_text(path, head + "\n".join([begin, *lines, end]) + tail)
    return True


def publish(lines: list[str], doc: str | None, mark: tuple[str, str]) -> int:
    """A report's tables: printed, or with `doc` written between its markers `mark`
    (a page without them is one line, not a traceback). The report's exit code."""
    text = "\n".join(lines)
    if not doc:
        print(text)
        return 0
    if not replace_marked(doc, *mark, [text]):
        raise SystemExit(f"{doc} has no {mark[0]} ... {mark[1]} to write the tables between")
    return 0
