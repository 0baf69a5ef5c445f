"""Predicted against measured: `sim step` beside the step benchmarks on 2 emulated hosts × 1 rank.

    python -m mpidp.sim.measured --rates "200mbit 1gbit 10gbit" [--models "mlp gpt"]
    (make step-vs-measured; root: `mpidp.cluster run` makes the hosts; a quiet machine)

For each trainer, local batch and rate it profiles the model on this machine (`sim
profile`), runs the trainer's step benchmark across 2 emulated hosts with overlap off
(serial) and on, and `sim step` for the same model, batch, buckets and rate, then
prints one row per configuration with the load before its run and the prediction's
error. The MLP is `bench overlap`'s ([256, 512, 512, 512, 10], one bucket per layer;
--mlp-batches), the GPT `bench gpt`'s (train_gpt.py's model, 0.1 MiB buckets;
--gpt-batches). The runs are kept in --out (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from mpidp import untrusted

from .profile import read

BENCH = untrusted.Record({"modes": untrusted.Record({
    m: untrusted.Record({"step_ms": untrusted.Num(0), "backward_ms": untrusted.Num(0),
                         "exposed_comm_ms": untrusted.Num(0)})
    for m in ("serial", "overlap")})})
STEP = untrusted.Record({"rows": untrusted.List(untrusted.Record(
    {"step_s": untrusted.Num(0), "exposed_s": untrusted.Num(0)}), min_len=1, max_len=1)})


def gbit(rate: str) -> float:
    """'200mbit' -> 0.2, '10gbit' -> 10.0 (Gbit/s)."""
    m = re.fullmatch(r"([\d.]+)(mbit|gbit)", rate)
    if not m:
        raise ValueError(f"a rate such as 200mbit or 10gbit, not {rate!r}")
    return float(m.group(1)) / (1000 if m.group(2) == "mbit" else 1)


def vocab() -> int:
    """The byte vocabulary of the corpus `bench gpt` trains on (this Python's stdlib)."""
    from mpidp.training import data
    return len(data.stdlib_text().vocab)


def commands(model: str, batch: int, bench: str) -> tuple[list[str], list[str], list[str]]:
    """(the model's `sim` flags, its benchmark's command, `sim step`'s bucket flags)."""
    py = sys.executable
    if model == "mlp":
        return (["--model", "mlp", "--data", "synthetic", "--hidden", "512,512,512"],
                [py, "-m", "mpidp.bench", "overlap", "--bucket-mb", "0", "--batch", str(batch),
                 "--steps", "30", "--modes", "serial,overlap", "--json", bench],
                ["--bucket-mb", "0", "--piece-mb", "none"])
    return (["--model", "gpt", "--vocab", str(vocab())],
            [py, "-m", "mpidp.bench", "gpt", "--batch", str(batch), "--json", bench],
            ["--bucket-mb", "0.1", "--first-bucket-mb", "0.1"])


def compare(bench_json: str, step_json: dict[str, str]) -> list[tuple]:
    """(mode, measured ms, predicted ms, measured backward ms, measured exposed ms,
    predicted exposed ms) from a benchmark's JSON and sim step JSONs."""
    bench = untrusted.check(untrusted.read_json(bench_json, 1 << 24), BENCH, bench_json)
    rows = []
    for mode, path in step_json.items():
        step = untrusted.check(untrusted.read_json(path, 1 << 20), STEP, path)["rows"][0]
        got = bench["modes"][mode]
        rows.append((mode, got["step_ms"], 1e3 * step["step_s"], got["backward_ms"],
                     got["exposed_comm_ms"], 1e3 * step["exposed_s"]))
    return rows


def backward_ms(profile: str) -> float:
    """The profile's backward, all units (ms): what `sim step` takes a backward to last."""
    return 1e3 * sum(u["backward_s"] for u in read(profile)["units"])


def run(models: dict[str, list[int]], rates: list[str], out: str) -> list[str]:
    py = sys.executable
    lines = ["| trainer | rate | batch | overlap | measured ms | predicted ms | error | "
             "backward ms (profile) | exposed ms measured | exposed ms predicted | load |",
             "|:---|:---|---:|:---|---:|---:|---:|---:|---:|---:|:---|"]
    for model, batches in models.items():
        for batch in batches:
            profile = os.path.join(out, f"profile-{model}-b{batch}.json")
            flags, _, _ = commands(model, batch, "")
            subprocess.run([py, "-m", "mpidp.sim", "profile", *flags, "--batch", str(batch),
                            "-o", profile], check=True)
            for rate in rates:
                load = f"{os.getloadavg()[0]:.2f}"
                bench = os.path.join(out, f"h2-{model}-{rate}-b{batch}.json")
                _, measure, buckets = commands(model, batch, bench)
                subprocess.run([py, "-m", "mpidp.cluster", "run", "--hosts", "2", "--rate",
                                rate, "--", *measure], check=True)
                steps = {}
                for mode in ("serial", "overlap"):
                    steps[mode] = os.path.join(out, f"step-{model}-{rate}-b{batch}-{mode}.json")
                    subprocess.run([py, "-m", "mpidp.sim", "step", *flags, "--ranks", "2",
                                    "--global-batch", str(2 * batch), *buckets,
                                    "--rate", str(gbit(rate)), "--profile", profile,
                                    "--json", steps[mode],
                                    *(["--no-overlap"] if mode == "serial" else [])],
                                   check=True, stdout=subprocess.DEVNULL)
                profiled = backward_ms(profile)
                for mode, got, want, bwd, exposed, predicted in compare(bench, steps):
                    lines.append(f"| {model} | {rate} | {batch} | "
                                 f"{'on' if mode == 'overlap' else 'off'} | {got:.1f} | "
                                 f"{want:.1f} | {(want - got) / got:+.0%} | {bwd:.1f} "
                                 f"({profiled:.1f}) | {exposed:.1f} | {predicted:.1f} | {load} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpidp.sim.measured", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="200mbit 1gbit 10gbit")
    p.add_argument("--models", default="mlp gpt", help="the trainers: mlp, gpt or both")
    p.add_argument("--mlp-batches", default="512 2048", help="the MLP's local batches")
    p.add_argument("--gpt-batches", default="12 48", help="the GPT's local batches")
    p.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    args = p.parse_args(argv)
    try:
        rates = args.rates.split()
        for r in rates:
            gbit(r)
        batches = {"mlp": args.mlp_batches, "gpt": args.gpt_batches}
        models = {}
        for m in args.models.split():
            if m not in batches:
                raise ValueError(f"--models: mlp or gpt, not {m!r}")
            models[m] = [int(b) for b in batches[m].split()]
            if not models[m] or min(models[m]) < 1:
                raise ValueError(f"--{m}-batches: positive integers, not {batches[m]!r}")
    except ValueError as e:
        p.error(str(e))
    with tempfile.TemporaryDirectory() as where:
        print("\n".join(run(models, rates, args.out or where)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
