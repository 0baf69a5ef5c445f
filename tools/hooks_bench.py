"""``python -m tools.hooks_bench``: does compression pay? The GPT trainer across emulated hosts.

For each link rate and each communication hook (none first), ``--runs`` runs of

    python -m mpidp.cluster run --hosts 2 --rate RATE -- python examples/train_gpt.py \\
        --max-steps STEPS --eval-every STEPS --comm-hook HOOK --dtype float32 --metrics F

(`make hooks-bench`; needs root, ip and tc, as every `mpidp.cluster` run). Each run's
last metrics row gives its step time (the global batch's tokens over ``tokens_per_s``,
measured since the evaluation before) and its held-out loss after STEPS steps. The table
has the medians over the runs, each hook's step time against none's at the same rate,
and the `sim step` prediction for the same model and link (``--predict``). Every run's
numbers go to ``--out``/hooks-bench.json. Flags after ``--`` go to the trainer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from mpidp import files, untrusted
from mpidp.sim.measured import vocab

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(HERE, "examples", "train_gpt.py")
ROW = untrusted.Record({"step": untrusted.Int(0, 1 << 40), "val_loss": untrusted.Num(0, 1e6),
                        "tokens_per_s": untrusted.Num(0, 1e12)})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.hooks_bench", description=__doc__)
    p.add_argument("--rates", default="100mbit,1gbit,10gbit", help="tc rates, comma-separated")
    p.add_argument("--hooks", default="none,fp16,bf16,powersgd:4", help="--comm-hook values")
    p.add_argument("--runs", type=int, default=3, help="runs of each setting (the median)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of each run")
    p.add_argument("--global-batch", type=int, default=24)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--timeout", type=int, default=1800, help="seconds a run may take")
    p.add_argument("--out", default="docs/bench/hooks", help="folder of the runs' files")
    p.add_argument("--predict", action="store_true",
                   help="add `sim step`'s predicted step (the flags after -- go to it too)")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("trainer", nargs="*", help="after --: more train_gpt.py flags")
    return p


def command(args, rate: str, hook: str, metrics: str) -> list[str]:
    """One run: the trainer on 2 emulated hosts at `rate` with `hook`."""
    py = os.path.abspath(sys.executable)
    return [py, "-m", "mpidp.cluster", "run", "--hosts", "2", "--rate", rate, "--timeout",
            str(args.timeout), "--", py, TRAIN, "--max-steps", str(args.steps),
            "--eval-every", str(args.steps), "--comm-hook", hook, "--dtype", "float32",
            "--global-batch", str(args.global_batch), "--context", str(args.context),
            "--progress", "never", "--metrics", os.path.abspath(metrics), *args.trainer]


def gbit(rate: str) -> float:
    """A tc rate (``100mbit``, ``1gbit``, ``2.5gbit``, ``500kbit``) in Gbit/s."""
    for unit, scale in (("kbit", 1e-6), ("mbit", 1e-3), ("gbit", 1.0)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"--rates: {rate!r} is not a tc rate in kbit, mbit or gbit")


# the trainer's flags that `sim step` takes too (each with a value): the model and buckets
SHARED = ("--layers", "--heads", "--width", "--bucket-mb", "--first-bucket-mb", "--optimizer",
          "--accum-steps", "--algorithm")


MODEL = SHARED[:3] + ("--optimizer",)  # those `sim profile` takes


def shared(flags: list[str], names=SHARED) -> list[str]:
    """Of the trainer's `flags`, those in `names` (with their values)."""
    out = []
    for k, flag in enumerate(flags):
        name = flag.split("=")[0]
        if name in names:
            out += [flag] if "=" in flag else flags[k : k + 2]
    return out


def predict(args, rates: list[str], hook_names: list[str]) -> dict:
    """(rate, hook) -> `sim step`'s predicted step ms: 2 hosts x 1 rank, the same model, its
    compute profiled once (`sim profile`, a rank's batch)."""
    out, profile = {}, os.path.join(args.out, "predicted-profile.json")
    model = ["--model", "gpt", "--vocab", str(vocab()), "--context", str(args.context),
             *shared(args.trainer, MODEL)]  # the trainer's corpus: its byte vocabulary
    cmd = [sys.executable, "-m", "mpidp.sim", "profile", *model, "--batch",
           str(max(1, args.global_batch // 2)), "-o", profile]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=HERE, check=True, stdout=subprocess.DEVNULL)
    for rate in rates:
        path = os.path.join(args.out, f"predicted-{rate}.json")
        cmd = [sys.executable, "-m", "mpidp.sim", "step", "--ranks", "2", "--rate",
               str(gbit(rate)), "--comm-hook", ",".join(hook_names), "--global-batch",
               str(args.global_batch), "--profile", profile, "--json", path,
               *model, *shared(args.trainer, SHARED[3:])]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=HERE, check=True, stdout=subprocess.DEVNULL)
        rows = untrusted.read_json(path, 1 << 20)["rows"]
        out.update({(rate, r["hook"]): 1e3 * r["step_s"] for r in rows})
    return out


def last_row(path: str, tokens_per_step: int) -> dict:
    """A run's result from its metrics file: step ms and held-out loss at its last row."""
    lines = untrusted.read_text(path, 1 << 20).splitlines()
    if not lines:
        raise untrusted.InputError(f"{path}: no metrics rows")
    row = untrusted.check(untrusted.parse_json(lines[-1], path), ROW, path)
    if row["tokens_per_s"] <= 0:
        raise untrusted.InputError(f"{path}: tokens_per_s is 0 (no step was timed)")
    return {"step": row["step"], "step_ms": 1e3 * tokens_per_step / row["tokens_per_s"],
            "val_loss": row["val_loss"]}


def table(results: list[dict], predicted: dict | None = None) -> str:
    """The Markdown table: medians per (rate, hook), the hook's step against none's."""
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        cells.setdefault((r["rate"], r["hook"]), []).append(r)
    lines = ["| link | hook | step ms (median) | vs none | held-out loss (median) | runs |"
             + " predicted step ms |" * bool(predicted),
             "|:---|:---|---:|---:|---:|---:|" + "---:|" * bool(predicted)]
    for (rate, hook), runs in cells.items():
        step = statistics.median(r["step_ms"] for r in runs)
        none = cells.get((rate, "none"))
        ratio = step / statistics.median(r["step_ms"] for r in none) if none else float("nan")
        loss = statistics.median(r["val_loss"] for r in runs)
        line = f"| {rate} | {hook} | {step:.1f} | {ratio:.2f}x | {loss:.4f} | {len(runs)} |"
        if predicted:
            line += f" {predicted.get((rate, hook), float('nan')):.1f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    rates, hook_names = args.rates.split(","), args.hooks.split(",")
    if "none" not in hook_names:
        hook_names = ["none", *hook_names]
    os.makedirs(args.out, exist_ok=True)
    predicted = predict(args, rates, hook_names) if args.predict and not args.dry_run else None
    results = []
    for run in range(1, args.runs + 1):  # a round of every setting, then the next round
        for rate in rates:
            for hook in hook_names:
                metrics = os.path.join(args.out, f"{rate}-{hook.replace(':', '')}-r{run}.jsonl")
                cmd = command(args, rate, hook, metrics)
                print(" ".join(cmd), flush=True)
                if args.dry_run:
                    continue
                if os.path.exists(metrics):
                    os.remove(metrics)
                done = subprocess.run(cmd, cwd=HERE, stdout=subprocess.DEVNULL)
                if done.returncode:
                    print(f"hooks_bench: {rate} {hook} run {run}: exit code {done.returncode}",
                          file=sys.stderr)
                    return 1
                row = last_row(metrics, args.global_batch * args.context)
                results.append({"rate": rate, "hook": hook, "run": run, **row,
                                "load": os.getloadavg()[0]})
    if args.dry_run:
        return 0
    files.write_json(os.path.join(args.out, "hooks-bench.json"), {"runs": results, "predicted": [
        {"rate": k[0], "hook": k[1], "step_ms": v} for k, v in (predicted or {}).items()]})
    print(table(results, predicted))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
