"""docs/torch.md's speed table from `make torch-bench`'s jobs: the medians over jobs.

    python -m tools.torch_table docs/bench/torch

Each job (`examples/bench_torch.py --json`, a file ROW-rJ.json) holds one setting's
rows, the medians of its rounds; a row of the table is the median over its jobs of
mpidp's and gloo's overlapped samples/s, their ratio and mpidp's overlap efficiency,
with the jobs' loads.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import sys

from mpidp import untrusted

# what a job file must hold to be read (bench_torch.py writes it; the rest is not read)
ROW = untrusted.Record({"backend": untrusted.Text(64), "mode": untrusted.Text(64),
                        "samples_per_s": untrusted.Num(0, 1e12),
                        "efficiency": untrusted.Optional(untrusted.Num(-1e6, 1e6))})
JOB = untrusted.Record({"load": untrusted.Num(0, 1e6),
                        "rows": untrusted.List(ROW, max_len=64)})

ROWS = {"n2-default": ("2 ranks, one host", "default"),
        "n2-big": ("2 ranks, one host", "9.3 MiB"),
        "hosts2-default": ("2 hosts x 1 rank, 1 Gbit/s", "default"),
        "hosts2-big": ("2 hosts x 1 rank, 1 Gbit/s", "9.3 MiB")}


def job_figures(job: dict, where: str) -> dict:
    """One job's overlapped samples/s per backend, their ratio, mpidp's efficiency."""
    job = untrusted.check(job, JOB, where)
    over = {r["backend"]: r for r in job["rows"] if r["mode"] == "overlap"}
    for backend in ("mpidp", "gloo"):
        if backend not in over or not over[backend]["samples_per_s"] > 0:
            raise untrusted.InputError(f"{where}: no timed overlap row of {backend}")
    return {"gloo": over["gloo"]["samples_per_s"], "mpidp": over["mpidp"]["samples_per_s"],
            "ratio": over["mpidp"]["samples_per_s"] / over["gloo"]["samples_per_s"],
            "efficiency": over["mpidp"]["efficiency"],
            "gloo_efficiency": over["gloo"]["efficiency"], "load": job["load"]}


def _median(values: list):
    """The median of the values there are (a job's efficiency is None where none of its
    communication was exposed, so nothing could hide: one rank), None if there are none."""
    there = [v for v in values if v is not None]
    return statistics.median(there) if there else None


def _two(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(folder: str) -> list[str]:
    by_row: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-r*.json"))):
        m = re.fullmatch(r"(.+)-r\d+\.json", os.path.basename(path))
        job = untrusted.read_json(path, 1 << 20)
        by_row.setdefault(m.group(1), []).append(job_figures(job, path))
    lines = ["| setting | model | gloo samples/s | mpidp samples/s | mpidp / gloo (jobs) "
             "| efficiency mpidp (gloo) | load |", "|---|---|---|---|---|---|---|"]
    for key, (setting, model) in ROWS.items():
        jobs = by_row.get(key)
        if not jobs:
            continue
        med = {k: _median([j[k] for j in jobs]) for k in jobs[0]}
        each = ", ".join(f"{j['ratio']:.2f}" for j in jobs)
        loads = f"{min(j['load'] for j in jobs):.1f}-{max(j['load'] for j in jobs):.1f}"
        lines.append(f"| {setting} | {model} | {med['gloo']:.1f} | {med['mpidp']:.1f} | "
                     f"{med['ratio']:.2f}x ({each}) | {_two(med['efficiency'])} "
                     f"({_two(med['gloo_efficiency'])}) | {loads} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.torch_table", description=__doc__)
    p.add_argument("folder")
    try:
        lines = table(p.parse_args(argv).folder)
    except untrusted.InputError as e:  # one line naming the file and field
        print(f"torch_table: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
