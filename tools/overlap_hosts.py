"""``python -m tools.overlap_hosts``: docs/overlap.md's across-hosts tables, from the runs.

The runs are `bench overlap --json` files in ``--data`` (docs/bench/overlap-hosts),
each with a .txt beside it whose first line is `uptime` before the run:

    h<H>-<rate>-b<batch>-r<k>.json   across H emulated hosts (`mpidp.cluster run`)
    h<H>x<P>-<rate>-b<batch>-r<k>.json  H hosts x P ranks each
    h<H>-<rate>-b<batch>-async.json  the same with MPIR_CVAR_ASYNC_PROGRESS=1
    n2-onehost-b<batch>-r<k>.json    2 ranks on this host

It rewrites the tables between the page's markers (with ``--cluster-doc``, the
targets' table in docs/cluster.md too) and, with ``--plot RUN.json
OUT.png``, draws one run's bucket timelines (`overlap.plot`). The commands that
made the runs are on the page (docs/overlap.md, "The targets of item 3").
"""

from __future__ import annotations

import argparse
import glob
import os
import re

import numpy as np

from mpidp.bench.output import read_json, replace_marked

from .report import _efficiency as efficiency_of

ONEHOST_BEGIN, ONEHOST_END = "<!-- overlap-onehost -->", "<!-- /overlap-onehost -->"


OVERLAP_HOSTS_BEGIN, OVERLAP_HOSTS_END = "<!-- overlap-hosts -->", "<!-- /overlap-hosts -->"
TARGETS_BEGIN, TARGETS_END = "<!-- overlap-targets -->", "<!-- /overlap-targets -->"
# issue 25's targets: (hosts, ranks per host, rate, local batch) -> (median, no run below)
TARGETS = {(2, 1, "1gbit", 2048): (0.9, 0.7), (2, 1, "1gbit", 512): (0.9, None),
           (2, 1, "600mbit", 1024): (0.8, None)}
NAME = re.compile(r"h(\d+)(?:x(\d+))?-([\w.]+)-b(\d+)-(r\d+|async)\.json$")


def _load_before(json_path: str) -> str:
    """The 1-minute load average `uptime` printed before the run (its .txt's first line)."""
    try:
        with open(json_path[:-len(".json")] + ".txt") as f:
            found = re.search(r"load average: ([\d.]+)", f.readline())
    except OSError:
        return "?"
    return found.group(1) if found else "?"


def _cut(modes: dict) -> str:
    """"; " and compute+blocks' backward (the cut's cost with nothing sent), if it ran."""
    cut = modes.get("compute+blocks")
    return f"; {cut['backward_ms']:.0f}" if cut else ""


def groups(paths: list[str]) -> dict:
    """(hosts, ranks per host, rate, batch, async) -> [(run name, path, its JSON)]."""
    out: dict = {}
    for path in sorted(paths):
        s = read_json(path)
        found = NAME.search(os.path.basename(path))
        hosts, ppn = int(found.group(1)), int(found.group(2) or 1)
        key = (hosts, ppn, found.group(3), int(found.group(4)),
               s.get("async_progress", "0") != "0")
        out.setdefault(key, []).append((found.group(5), path, s))
    return out


def targets_table(paths: list[str]) -> list[str]:
    """Issue 25's targets: per setting, the default's efficiency over its runs (median,
    lowest, each run's load before it) against the target, and plain polling's."""
    found = groups(paths)
    lines = ["| setting | runs (load before) | default: median (lowest) | target | "
             "verdict | plain polling (`overlap`): median |", "|---|---|---:|---|---|---:|"]
    for (hosts, ppn, rate, batch), (median, floor) in TARGETS.items():
        runs = found.get((hosts, ppn, rate, batch, False), [])
        if not runs:
            lines.append(f"| {hosts} x {ppn}, {rate}, batch {batch} | not run | | | | |")
            continue
        eff = [efficiency_of(s, "default") for _, _, s in runs]
        plain = [efficiency_of(s, "overlap") for _, _, s in runs if "overlap" in s["modes"]]
        got, low = float(np.median(eff)), min(eff)
        short = [f"median {median - got:.2f} short"] if got < median else []
        if floor is not None and low < floor:
            short.append(f"lowest {floor - low:.2f} short")
        want = f">= {median}" + (f", none < {floor}" if floor is not None else "")
        verdict = "missed: " + ", ".join(short) if short else "met"
        loads = ", ".join(_load_before(path) for _, path, _ in runs)
        lines.append(f"| {hosts} x {ppn}, {rate}, batch {batch} | {len(runs)} ({loads}) | "
                     f"{got:+.2f} ({low:+.2f}) | {want} | {verdict} | "
                     + (f"{float(np.median(plain)):+.2f} |" if plain else " |"))
    return lines + [""]


def overlap_hosts_tables(paths: list[str], base: str = ".") -> list[str]:
    """Per link and local batch (`bench overlap --json` runs across emulated hosts, named
    ...-<rate>-b<batch>-r<k>.json): every run with its load average and each mode's
    efficiency; then per mode the median and the lowest over the runs, and the bucket
    timeline's medians (buckets but the last complete before backward ends; the last
    one's completion after backward's end, ms)."""
    from mpidp.bench.overlap import BASELINES  # (here: it imports MPI, which the tables need not)

    lines = []
    for (hosts, ppn, rate, batch, asynchronous), runs in sorted(groups(paths).items()):
        modes = [m for m in runs[0][2]["modes"] if m not in BASELINES]
        lines += [f"**{hosts} hosts x {ppn} rank{'s' * (ppn > 1)}, {rate}, local batch {batch}"
                  f"{', MPIR_CVAR_ASYNC_PROGRESS=1' if asynchronous else ''}**: efficiency "
                  "per run (hidden / hideable, medians of the run's steps):", "",
                  "| run | load before, after | compute ms (backward; cut) | serial ms (exposed) | "
                  + " | ".join(modes) + " |", "|---|---|---|---|" + "---:|" * len(modes)]
        effs = {m: [] for m in modes}
        for name, path, s in runs:
            m = s["modes"]
            for mode in modes:
                effs[mode].append(efficiency_of(s, mode))
            after = s.get("load_average", ["?"])[0]
            after = f"{after:.1f}" if isinstance(after, float) else after
            link = os.path.relpath(path, base)
            lines.append(f"| [{name}]({link}) | {_load_before(path)}, {after} "
                         f"| {m['compute']['step_ms']:.0f} ({m['compute']['backward_ms']:.0f}"
                         f"{_cut(m)}) "
                         f"| {m['serial']['step_ms']:.0f} ({m['serial']['exposed_comm_ms']:.0f}) "
                         "| " + " | ".join(f"{effs[mode][-1]:+.2f}" for mode in modes) + " |")
        lines.append("| median (lowest) | | | | " + " | ".join(
            f"{float(np.median(v)):+.2f} ({min(v):+.2f})" for v in effs.values()) + " |")
        lines += ["", "| mode | backward ms | buckets done before backward ends | last bucket "
                  "done after backward, ms |", "|---|---:|---:|---:|"]
        for mode in modes:
            backward, early, tail = [], [], []
            for _, _, s in runs:
                e = s["modes"][mode]
                backward.append(e["backward_ms"])
                done = [b["complete_ms"] <= e["backward_ms"] for b in e["buckets"][:-1]]
                early.append(f"{sum(done)}/{len(done)}")
                tail.append(e["buckets"][-1]["complete_ms"] - e["backward_ms"])
            lines.append(f"| {mode} | {float(np.median(backward)):.0f} | {', '.join(early)} | "
                         f"{float(np.median(tail)):.1f} |")
        lines.append("")
    return lines


def onehost_table(paths: list[str], base: str = ".") -> list[str]:
    """2 ranks on one host: per run, the load and each mode's median step; then whether
    the default is slower than serial by more than the run-to-run spread of serial."""
    runs = []
    for path in sorted(paths):
        runs.append((path, read_json(path)))
    if not runs:
        return []
    modes = list(runs[0][1]["modes"])
    lines = ["| run | load before, after | " + " | ".join(f"{m} ms" for m in modes)
             + " | default - serial ms |", "|---|---|" + "---:|" * (len(modes) + 1)]
    gaps, serial = [], []
    for path, s in runs:
        m = s["modes"]
        gaps.append(m["default"]["step_ms"] - m["serial"]["step_ms"])
        serial.append(m["serial"]["step_ms"])
        after = s.get("load_average", ["?"])[0]
        after = f"{after:.1f}" if isinstance(after, float) else after
        name = re.sub(r".*-(r\d+)\.json$", r"\1", path)
        lines.append(f"| [{name}]({os.path.relpath(path, base)}) | {_load_before(path)}, {after} | "
                     + " | ".join(f"{m[mode]['step_ms']:.2f}" for mode in modes)
                     + f" | {gaps[-1]:+.2f} |")
    spread = max(serial) - min(serial)
    gap = float(np.median(gaps))
    lines += ["", f"Median default - serial: {gap:+.2f} ms a step; serial's run-to-run spread "
              f"(max - min of its medians): {spread:.2f} ms: the default is "
              + ("**not** slower than serial by more than the spread."
                 if gap <= spread else f"slower than serial by more than the spread, by "
                 f"{gap - spread:.2f} ms."), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.overlap_hosts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="docs/bench/overlap-hosts")
    p.add_argument("--doc", default="docs/overlap.md")
    p.add_argument("--cluster-doc", default=None, help="docs/cluster.md: the targets there too")
    p.add_argument("--plot", nargs=2, metavar=("RUN.json", "OUT.png"))
    args = p.parse_args(argv)
    hosts = glob.glob(os.path.join(args.data, "h*.json"))
    if hosts and replace_marked(args.doc, OVERLAP_HOSTS_BEGIN, OVERLAP_HOSTS_END,
                                overlap_hosts_tables(hosts, os.path.dirname(args.doc))):
        print(f"updated the across-hosts tables in {args.doc}")
    for doc in filter(None, (args.doc, args.cluster_doc)):
        if hosts and replace_marked(doc, TARGETS_BEGIN, TARGETS_END, targets_table(hosts)):
            print(f"updated the targets' table in {doc}")
    onehost = glob.glob(os.path.join(args.data, "n2-onehost-*.json"))
    if onehost and replace_marked(args.doc, ONEHOST_BEGIN, ONEHOST_END,
                                  onehost_table(onehost, os.path.dirname(args.doc))):
        print(f"updated the one-host table in {args.doc}")
    if args.plot:
        from mpidp.bench.overlap import plot

        plot(read_json(args.plot[0]), args.plot[1])
        print(f"drew {args.plot[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
