"""Predicted against measured: `sim step` beside `bench overlap` on 2 emulated hosts × 1 rank.

    python -m mpidp.sim.measured --rates "200mbit 1gbit 10gbit" --batches "512 2048"
    (make step-vs-measured; root: `mpidp.cluster run` makes the hosts; a quiet machine)

For each rate and local batch it profiles bench overlap's MLP ([256, 512, 512, 512, 10],
one bucket per layer) on this machine, runs `bench overlap --modes serial,overlap` across
2 emulated hosts (its median step, the slowest rank's), and `sim step` for the same
model, batch, buckets and rate, overlap off (serial) and on, then prints one row per
configuration with the load before its run and the prediction's error. The runs are
kept in --out (default: a temporary folder). The GPT's runs are not here yet.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from mpidp import untrusted

MODEL = ["--model", "mlp", "--data", "synthetic", "--hidden", "512,512,512"]
BENCH = untrusted.Record({"modes": untrusted.Record({
    m: untrusted.Record({"step_ms": untrusted.Num(0)}) for m in ("serial", "overlap")})})
STEP = untrusted.Record({"rows": untrusted.List(untrusted.Record(
    {"step_s": untrusted.Num(0)}), min_len=1, max_len=1)})


def gbit(rate: str) -> float:
    """'200mbit' -> 0.2, '10gbit' -> 10.0 (Gbit/s)."""
    m = re.fullmatch(r"([\d.]+)(mbit|gbit)", rate)
    if not m:
        raise ValueError(f"a rate such as 200mbit or 10gbit, not {rate!r}")
    return float(m.group(1)) / (1000 if m.group(2) == "mbit" else 1)


def compare(bench_json: str, step_json: dict[str, str]) -> list[tuple[str, float, float]]:
    """(mode, measured ms, predicted ms) from a bench overlap JSON and sim step JSONs."""
    bench = untrusted.check(untrusted.read_json(bench_json, 1 << 24), BENCH, bench_json)
    rows = []
    for mode, path in step_json.items():
        step = untrusted.check(untrusted.read_json(path, 1 << 20), STEP, path)
        rows.append((mode, bench["modes"][mode]["step_ms"], 1e3 * step["rows"][0]["step_s"]))
    return rows


def run(rates: list[str], batches: list[int], out: str) -> list[str]:
    py = sys.executable
    lines = ["| rate | batch | overlap | measured ms | predicted ms | error | load before |",
             "|:---|---:|:---|---:|---:|---:|:---|"]
    for batch in batches:
        profile = os.path.join(out, f"profile-b{batch}.json")
        subprocess.run([py, "-m", "mpidp.sim", "profile", *MODEL, "--batch", str(batch),
                        "-o", profile], check=True)
        for rate in rates:
            load = f"{os.getloadavg()[0]:.2f}"
            bench = os.path.join(out, f"h2-{rate}-b{batch}.json")
            subprocess.run([py, "-m", "mpidp.cluster", "run", "--hosts", "2", "--rate", rate,
                            "--", py, "-m", "mpidp.bench", "overlap", "--bucket-mb", "0",
                            "--batch", str(batch), "--steps", "30", "--modes",
                            "serial,overlap", "--json", bench], check=True)
            steps = {}
            for mode in ("serial", "overlap"):
                steps[mode] = os.path.join(out, f"step-{rate}-b{batch}-{mode}.json")
                subprocess.run([py, "-m", "mpidp.sim", "step", *MODEL, "--ranks", "2",
                                "--global-batch", str(2 * batch), "--bucket-mb", "0",
                                "--piece-mb", "none", "--rate", str(gbit(rate)),
                                "--profile", profile, "--json", steps[mode],
                                *(["--no-overlap"] if mode == "serial" else [])],
                               check=True, stdout=subprocess.DEVNULL)
            for mode, got, want in compare(bench, steps):
                lines.append(f"| {rate} | {batch} | {'on' if mode == 'overlap' else 'off'} | "
                             f"{got:.1f} | {want:.1f} | {(want - got) / got:+.0%} | {load} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpidp.sim.measured", description=__doc__)
    p.add_argument("--rates", default="200mbit 1gbit 10gbit")
    p.add_argument("--batches", default="512 2048")
    p.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    args = p.parse_args(argv)
    try:
        rates = args.rates.split()
        for r in rates:
            gbit(r)
        batches = [int(b) for b in args.batches.split()]
    except ValueError as e:
        p.error(str(e))
    with tempfile.TemporaryDirectory() as where:
        print("\n".join(run(rates, batches, args.out or where)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
