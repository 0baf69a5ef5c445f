"""Several sweeps of one rank count, merged into one: the median over runs, and the spread.

``make bench`` runs the collectives sweep ``BENCH_RUNS`` times per rank count
(``collectives-n2-r1.json`` .. ``-r3.json``), at different moments, because one
run differs from the next by more than most of the margins being judged
(docs/benchmarks-notes.md, point 0). For every (collective, placement, size,
algorithm, persistent) the merged row's ``time_us`` is the median over runs of
each run's median, and ``runs_us`` keeps the per-run medians in run order, so
that a ratio can be given with its run-to-run range (the ratio within each run,
where native and the algorithm were timed side by side). A single file (the
older ``collectives-n2.json``) is a merge of one run: spread 0.
"""

from __future__ import annotations

import glob
import os
import re
import statistics

from mpidp.bench.output import bus_factor, read_json

FILE = re.compile(r"collectives-n(\d+)(?:-r(\d+))?\.json$")


def key(row: dict) -> tuple:
    return (row["collective"], row["inplace"], row["bytes"], row["algorithm"],
            bool(row.get("persistent")))


def merge(runs: list[dict]) -> dict:
    """One run from several of the same rank count: metadata of the first, rows merged.

    Each merged row: ``time_us`` the median of the runs' medians, ``min_us`` the
    minimum, ``runs_us`` the per-run medians (None where a run lacks the row),
    ``spread`` (max - min) / median over runs, ``wrong`` summed, bandwidths and
    the speed-up recomputed from the merged times.
    """
    if len(runs) == 1 and all("runs_us" in r for r in runs[0]["rows"]):
        return runs[0]  # written merged already (report --merged): keep its spread
    merged: dict = {}
    for i, run in enumerate(runs):
        for r in run["rows"]:
            entry = merged.setdefault(key(r), {"rows": [None] * len(runs)})
            entry["rows"][i] = r
    rows, native = [], {}
    for entry in merged.values():
        present = [r for r in entry["rows"] if r is not None]
        times = [r["time_us"] for r in present]
        med = statistics.median(times)
        row = dict(present[0])
        n = row.get("ranks") or runs[0]["ranks"]
        algbw = row["bytes"] / med / 1e3 if med > 0 else 0.0
        row.update(time_us=med, min_us=min(r["min_us"] for r in present),
                   runs_us=[r["time_us"] if r else None for r in entry["rows"]],
                   spread=(max(times) - min(times)) / med if med > 0 else 0.0,
                   wrong=sum(r["wrong"] for r in present), algbw_gbps=algbw,
                   busbw_gbps=algbw * bus_factor(row["collective"], n))
        resolved = {r.get("resolved") for r in present} - {None}
        if len(resolved) > 1:  # auto chose differently in different runs: say so
            row["resolved"] = "/".join(sorted(resolved))
        for field in ("mem_first_bytes", "mem_steady_bytes"):
            if any(r.get(field) is not None for r in present):
                row[field] = max(r[field] for r in present if r.get(field) is not None)
        if row["algorithm"] == "native" and not row.get("persistent"):
            native[key(row)[:3]] = med
        rows.append(row)
    for row in rows:
        nat = native.get(key(row)[:3])
        row["speedup"] = nat / row["time_us"] if nat and row["time_us"] > 0 else None
    out = dict(runs[0])
    out.update(rows=rows, runs=len(runs), dates=[r.get("date", "?") for r in runs])
    return out


def ratio_range(num: dict, den: dict) -> tuple[float, float] | None:
    """min and max over runs of num/den, each run's two times taken side by side."""
    pairs = [(a, b) for a, b in zip(num.get("runs_us") or [num["time_us"]],
                                    den.get("runs_us") or [den["time_us"]], strict=False)
             if a and b]
    if not pairs:
        return None
    ratios = [a / b for a, b in pairs]
    return min(ratios), max(ratios)


def ranks_of(path: str) -> int:
    m = FILE.search(os.path.basename(path))
    return int(m.group(1)) if m else 0


def load(data_dir: str) -> list[dict]:
    """Every rank count's runs in ``data_dir``, merged, by rank count.

    ``collectives-n<N>-r<K>.json`` are the runs of N ranks; a lone
    ``collectives-n<N>.json`` (the format before several runs) is read when N
    has no ``-r`` files.
    """
    by_ranks: dict = {}
    for path in glob.glob(os.path.join(data_dir, "collectives-n*.json")):
        m = FILE.search(os.path.basename(path))
        if m:
            by_ranks.setdefault(int(m.group(1)), []).append((int(m.group(2) or 0), path))
    runs = []
    for n in sorted(by_ranks):
        paths = sorted(by_ranks[n])
        numbered = [p for k, p in paths if k > 0]
        group = []
        for path in numbered or [p for _, p in paths]:
            group.append(read_json(path))
        runs.append(merge(group))
    return runs
