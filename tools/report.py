"""``python -m tools.report``: write docs/benchmarks.md from the benchmarks' JSON files.

    python -m tools.report [--data docs/bench] [--img docs/img] [--out docs/benchmarks.md]

Reads ``collectives-n<N>-r<K>.json`` (from ``python -m mpidp.bench collectives
--json``, run K of N ranks; a lone ``collectives-n<N>.json`` where N has no runs
numbered) for every rank count found in ``--data``, merged over runs (runs.py),
and, where present, ``overlap-n<N>.txt`` /
``overlap-n<N>.json`` and ``calibrate-n<N>.txt`` (the other subcommands' output).
Draws one PNG per rank count into ``--img`` and writes the page: the machine,
the method, the headline ratios, every target of issue 18 with met / missed
computed from the rows (targets.py; never typed by hand), the tables, the
memory figures and the plots. A hand-written ``--notes`` file (the analysis of
missed targets) is included verbatim if it exists. ``make bench`` runs it last.
"""

from __future__ import annotations

import argparse
import glob
import os
import re

from mpidp import files
from mpidp.bench.output import (
    COLLECTIVES,
    TITLES,
    human,
    placement,
    plot,
    read_json,
    replace_marked,
    write_json,
)

from . import runs as merged_runs
from .runs import ratio_range
from .targets import before, best_mpidp, evaluate, judged, status

MIB = 1 << 20
STANDARD_MAX = 64 * MIB


def group(rows: list[dict]) -> dict:
    """{(collective, inplace): {bytes: {name: row}}}, in sweep order; name "auto persistent"..."""
    out: dict = {}
    for r in rows:
        name = r["algorithm"] + (" persistent" if r.get("persistent") else "")
        out.setdefault((r["collective"], r["inplace"]), {}).setdefault(r["bytes"], {})[name] = r
    return out


# ------------------------------------------------------------------ the page, section by section

def machine(runs: list[dict]) -> list[str]:
    m = runs[0]
    lib = [" ".join(line.split())
           for line in m.get("mpi_library", "?").replace("\x00", "").splitlines()]
    lines = ["## Machine", "",
             f"- CPU: {m.get('cpu', '?')}, {m.get('cores', '?')} cores ({m.get('host', '?')}, "
             f"{m.get('platform', '?')})",
             f"- MPI library: {lib[0] if lib else '?'}"
             + (f" ({', '.join(s.strip() for s in lib[1:4])})" if len(lib) > 1 else ""),
             f"- Python {m.get('python', '?')}, mpi4py {m.get('mpi4py', '?')}, "
             f"numpy {m.get('numpy', '?')}",
             "- runs: " + "; ".join(f"{r['ranks']} ranks on " + ", ".join(r.get("dates")
                                                                       or [r.get("date", "?")])
                                    for r in runs),
             f"- peers: native ({m.get('mpi_library_short', '?')}); gloo: "
             f"{m.get('gloo', 'not installed')}",
             ""]
    return lines


def method(runs: list[dict]) -> list[str]:
    m = runs[0]
    return [
        "## Method", "",
        f"`python -m mpidp.bench collectives` under `mpiexec -n N`, {m.get('dtype')} data, "
        f"op {m.get('op')}, sizes doubling from {human(m.get('min_bytes', 8))} to "
        f"{human(m.get('max_bytes', 0))}. Per size: {m.get('warmup')} warm-up and "
        f"{m.get('iters')} timed iterations up to {human(m.get('full_iters_up_to', MIB))}, "
        f"halved per doubling above (at least {min(m.get('iters', 5), m.get('min_iters', 5))} "
        "timed); an iteration runs native and every algorithm once each, in turn, so that "
        "a passing disturbance slows them alike, in an order that rotates by one per "
        "iteration, so that each call follows each other one equally often; a barrier "
        "before each call; a call's time "
        "is the slowest rank's; the tables show "
        "the median over iterations. Native is the MPI library's own call through mpi4py "
        "(`Allreduce`, `Reduce_scatter_block`, `Allgather`, `Bcast`), timed in the same run, "
        "size by size, beside every mpidp algorithm and `auto` (in brackets: what auto chose). "
        "Speed-up = native time / algorithm time (> 1: faster than the MPI library). "
        "busbw = size / time × (all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, "
        "broadcast 1), as nccl-tests. Size is the whole vector. Every result, warm-up "
        "included, is compared with the native result.", "",
        f"Each rank count's sweep ran {' / '.join(str(r.get('runs', 1)) for r in runs)} "
        "time(s) (2 ranks / 4 ranks, at different moments): every figure is the median over "
        "runs of each run's median, and where a ratio is given with *runs a-b* that is its "
        "lowest and highest value within one run (native and the algorithm timed side by "
        "side in the same run). *Native persistent* is the MPI library's `*_init` form, "
        "*auto persistent* mpidp's (`mpidp.allreduce_init` ...), planned once per size, "
        "started each iteration. *gloo* (where PyTorch is installed) is "
        "`torch.distributed` with the gloo backend on the same buffers (`torch.from_numpy` "
        "views): `all_reduce` is in place only, so its out-of-place row includes copying "
        "sendbuf into recvbuf first, as a user would.", ""]


def ratio_text(num: dict, den: dict) -> str:
    """'1.25x (1.20-1.31)': num/den of the medians, and its range over runs."""
    rng = ratio_range(num, den)
    return f"{num['time_us'] / den['time_us']:.2f}x" + (
        f" ({rng[0]:.2f}-{rng[1]:.2f})" if rng and rng[0] != rng[1] else "")


def headline(runs: list[dict]) -> list[str]:
    lines = ["## Headline", "",
             "Largest size: the best mpidp algorithm and auto against native (speed-up = "
             "native time / mpidp time); smallest size: auto's latency, plain and persistent, "
             "against native's (out of place where measured). In brackets: the lowest and "
             "highest value of the ratio within one run.", "",
             "| ranks | collective | size | native µs | best mpidp | speed-up | auto | "
             "auto speed-up | smallest | native µs | auto µs | auto / native | "
             "auto persistent / native |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        groups = group(run["rows"])
        for collective in COLLECTIVES:
            key = next((k for k in ((collective, False), (collective, None), (collective, True))
                        if k in groups), None)
            if key is None:
                continue
            sizes = groups[key]
            big, small = max(sizes), min(sizes)
            b, s = sizes[big], sizes[small]
            best = best_mpidp(b)
            if "native" not in b or best is None or "auto" not in b:
                continue
            nat, snat = b["native"], s["native"]
            persistent = (ratio_text(s["auto persistent"], snat) if "auto persistent" in s
                          else "")
            lines.append(
                f"| {run['ranks']} | {TITLES[collective]} | {human(big)} | "
                f"{nat['time_us']:.0f} | {best['algorithm']} | {ratio_text(nat, best)} | "
                f"{b['auto'].get('resolved')} | {ratio_text(nat, b['auto'])} | "
                f"{human(small)} | {snat['time_us']:.1f} | {s['auto']['time_us']:.1f} | "
                f"{ratio_text(s['auto'], snat)} | {persistent} |")
    return [*lines, ""]


def target_table(runs: list[dict], baseline: list[dict] | None = None
                 ) -> tuple[list[str], int, int]:
    """Issue 18's targets: judged on 2 ranks, reported on the others; beside the baseline's."""
    then = {r["ranks"]: group(r["rows"]) for r in baseline or []}
    lines = ["## Targets", "",
             "From issue 18, evaluated on the medians over runs for every collective and "
             "placement; judged on 2 ranks (one core per rank), reported on the others "
             "(oversubscribed here: not a target). *Worst case* is the size where the target "
             "is closest to failing (or fails by most), with its range over runs. *Before*: "
             "the same figure on the previously committed run (docs/bench/baseline), where "
             "it had the rows. *best algorithm* is the fastest mpidp algorithm at that size, "
             "auto not counted.", "",
             "| ranks | collective | placement | target | status | worst case | before |",
             "|---|---|---|---|---|---|---|"]
    met = total = 0
    for run in runs:
        groups = group(run["rows"])
        for (collective, inplace), sizes in groups.items():
            old = then.get(run["ranks"], {}).get((collective, inplace))
            old_targets = evaluate(collective, old) if old else []
            for i, t in enumerate(evaluate(collective, sizes)):
                if judged(run["ranks"]):
                    total += t["met"] is not None
                    met += bool(t["met"])
                prev = before(t, old_targets[i]) if old_targets else "—"
                lines.append(f"| {run['ranks']} | {TITLES[collective]} | {placement(inplace)} | "
                             f"{t['target']} | {status(t['met'], run['ranks'])} | "
                             f"{t['detail']} | {prev} |")
    lines[2] = f"{met} of {total} judged targets met. " + lines[2]
    return [*lines, ""], met, total


def tables(run: dict) -> list[str]:
    lines = [f"### {run['ranks']} ranks", ""]
    wrong = sum(r["wrong"] for r in run["rows"])
    bad = [r for r in run["rows"] if r["wrong"]]
    lines.append(f"{len(run['rows'])} rows, every result checked against native: "
                 + ("0 wrong items." if not wrong else
                    f"**{wrong} wrong items** in " + ", ".join(
                        f"{r['collective']} {r['algorithm']} {human(r['bytes'])}" for r in bad)))
    lines.append("")
    for (collective, inplace), sizes in group(run["rows"]).items():
        names = list(dict.fromkeys(a for by_alg in sizes.values() for a in by_alg
                                   if a != "native"))
        lines += [f"**{TITLES[collective]}, {placement(inplace)}**: median µs "
                  "(speed-up over native); busbw in GB/s", "",
                  "| size | count | native | " + " | ".join(names) + " | busbw native | "
                  "busbw best |" + (" busbw gloo |" if "gloo" in names else ""),
                  "|---" * (len(names) + 5 + ("gloo" in names)) + "|"]
        for nbytes, by_alg in sizes.items():
            native = by_alg.get("native")
            cells = []
            for a in names:
                r = by_alg.get(a)
                if r is None:
                    cells.append("")
                    continue
                cell = f"{r['time_us']:.1f}"
                if native and r["time_us"] > 0:
                    cell += f" ({native['time_us'] / r['time_us']:.2f}x)"
                if a.startswith("auto") and r.get("resolved"):
                    cell += f" [{r['resolved']}]"
                cells.append(cell)
            best = best_mpidp(by_alg)
            count = next(iter(by_alg.values()))["count"]
            lines.append(f"| {human(nbytes)} | {count} | "
                         + (f"{native['time_us']:.1f}" if native else "") + " | "
                         + " | ".join(cells) + " | "
                         + (f"{native['busbw_gbps']:.3f}" if native else "") + " | "
                         + (f"{best['busbw_gbps']:.3f} ({best['algorithm']})" if best else "")
                         + " |" + (f" {by_alg['gloo']['busbw_gbps']:.3f} |" if "gloo" in by_alg
                                   else " |" if "gloo" in names else ""))
        lines.append("")
    return lines


def memory(runs: list[dict]) -> list[str]:
    lines = ["## Memory", "",
             "Peak new allocation during one call at the largest size (tracemalloc, which sees "
             "NumPy's buffers; max over ranks). *First call*: with an empty ScratchPool, i.e. the "
             "scratch the algorithm needs (ring: one block; halving: at most half the vector; "
             "out-of-place reduce-scatter also takes a pooled work vector for its partial "
             "sums, since MPI forbids writing sendbuf). *Steady*: after warm-up, with the pool "
             "holding the buffers; what remains is Python objects (generators, request "
             "lists).", "",
             "| ranks | collective | placement | algorithm | size | first call | "
             "first / size | steady |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for r in run["rows"]:
            if r.get("mem_first_bytes") is None:
                continue
            algo = r["algorithm"] + (f" [{r['resolved']}]" if r["algorithm"] == "auto" else "")
            lines.append(f"| {run['ranks']} | {TITLES[r['collective']]} | "
                         f"{placement(r['inplace'])} | {algo} | {human(r['bytes'])} | "
                         f"{human(r['mem_first_bytes'])} | "
                         f"{r['mem_first_bytes'] / r['bytes']:.2f} | "
                         f"{human(r['mem_steady_bytes'])} |")
    return [*lines, ""]


def verbatim(title: str, paths: list[str], intro: str) -> list[str]:
    if not paths:
        return []
    lines = [f"## {title}", "", intro, ""]
    for path in paths:
        n = re.search(r"-n(\d+)\.", path)
        lines += [f"### {n.group(1) if n else '?'} ranks", "", "```"]
        with open(path) as f:
            lines += f.read().rstrip().splitlines()
        lines += ["```", ""]
    return lines


def overlap_headline(paths: list[str]) -> list[str]:
    """One line per rank count from overlap JSON: the hidden fraction of each overlapped mode."""
    lines = []
    for path in paths:
        try:
            s = read_json(path)
            parts = [f"{mode} hides {e['hidden_fraction']:.0%} of the communication "
                     f"({e['step_ms']:.1f} ms a step)"
                     for mode, e in s.get("modes", {}).items() if "hidden_fraction" in e]
            serial = s.get("modes", {}).get("serial", {}).get("step_ms")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if parts:
            lines.append(f"- {s.get('ranks', '?')} ranks: serial {serial:.1f} ms a step; "
                         + "; ".join(parts) + ".")
    return [*lines, ""] if lines else []


def ranks_of(path: str) -> int:
    m = re.search(r"-n(\d+)[.-]", os.path.basename(path))
    return int(m.group(1)) if m else 0


def render(runs: list[dict], images: dict, data_dir: str, out_dir: str, note: str = "",
           notes_text: str = "", baseline: list[dict] | None = None,
           see_also: list[str] | None = None, title: str = "Benchmarks") -> str:
    """The whole page. `images`: {ranks: png path}; paths in the page are relative to out_dir.

    `baseline`: the previously committed runs, for the targets' *before* column;
    `see_also`: other pages of the same kind (another MPI library's), linked at the top.
    """

    def rel(path: str) -> str:
        return os.path.relpath(path, out_dir)

    lines = [f"# {title}", "",
             "<!-- generated by `python -m tools.report` (`make bench-publish`); do not "
             "edit: edit the notes file or the generator -->", "",
             "mpidp's collectives against the MPI library's own, on one machine, "
             "nccl-tests style. Regenerate with `make bench`, then `make bench-publish` "
             "(raw rows: "
             + ", ".join(f"[{os.path.basename(p)}]({rel(p)})"
                         for p in sorted(glob.glob(os.path.join(data_dir, "collectives-n*.*"))))
             + ").", ""]
    others = [p for p in see_also or [] if os.path.exists(p)]
    if others:
        lines += ["The same sweep against another MPI library: "
                  + ", ".join(f"[{os.path.basename(p)}]({rel(p)})" for p in others) + ".", ""]
    if note:
        lines += [f"> **{note}**", ""]
    short = [r for r in runs if r.get("max_bytes", STANDARD_MAX) < STANDARD_MAX]
    if short:
        lines += [f"> Not the standard sweep: {', '.join(str(r['ranks']) for r in short)}-rank "
                  f"run(s) stop at {human(short[0]['max_bytes'])} instead of "
                  f"{human(STANDARD_MAX)}.", ""]
    lines += machine(runs) + method(runs) + headline(runs)
    target_lines, _, _ = target_table(runs, baseline)
    lines += target_lines
    if notes_text:
        lines += ["## Analysis", "", notes_text.rstrip(), ""]
    lines += ["## Plots", "", "busbw (left) and median time (right) against size, one line "
              "per algorithm, native dashed (out of place).", ""]
    for ranks, png in sorted(images.items()):
        lines += [f"![{ranks} ranks]({rel(png)})", ""]
    lines += ["## Tables", ""]
    for run in runs:
        lines += tables(run)
    lines += memory(runs)
    overlap_json = sorted(glob.glob(os.path.join(data_dir, "overlap-n*.json")), key=ranks_of)
    overlap_txt = sorted(glob.glob(os.path.join(data_dir, "overlap-n*.txt")), key=ranks_of)
    ov = verbatim("Overlap", overlap_txt, "`python -m mpidp.bench overlap`: the trainer's step "
                  "time without communication, with the all-reduce after backward, and "
                  "overlapped with it.")
    if ov:
        lines += ov[:4] + overlap_headline(overlap_json) + ov[4:]
    lines += verbatim("Calibration", sorted(glob.glob(os.path.join(data_dir, "calibrate-n*.txt")),
                                            key=ranks_of),
                      "`python -m mpidp.bench calibrate`: the fitted α, β, γ and the cost "
                      "model's predictions beside the measured times.")
    return "\n".join(lines).rstrip() + "\n"


def load_runs(data_dir: str) -> list[dict]:
    """Every rank count's runs, merged (median over runs; see runs.py)."""
    return merged_runs.load(data_dir)


README_BEGIN, README_END = "<!-- bench-headline -->", "<!-- /bench-headline -->"
OVERLAP_BEGIN, OVERLAP_END = "<!-- overlap-tables -->", "<!-- /overlap-tables -->"


def update_readme(path: str, runs: list[dict]) -> bool:
    """Put the headline table and the targets count between the README's markers."""
    _, met, total = target_table(runs)
    table = headline(runs)[4:]  # the table rows, without the page's heading and intro
    return replace_marked(path, README_BEGIN, README_END, [
        *table, f"{met} of {total} judged targets met (2 ranks); the page says which, by how "
        "much, and why."])


def overlap_tables(paths: list[str]) -> list[str]:
    """One Markdown table per overlap JSON (`bench overlap --json`): every mode's medians."""
    lines = []
    for path in paths:
        s = read_json(path)
        lines += [f"{s['ranks']} ranks, MLP {'-'.join(map(str, s['sizes']))} ({s['dtype']}), "
                  f"local batch {s['batch']}, bucket_mb {s['bucket_mb']}, algorithm "
                  f"{s['algorithm']} ([{os.path.basename(path)}](bench/"
                  f"{os.path.basename(path)})), median ms:", "",
                  "| mode | step | backward | exposed comm | hidden | efficiency |",
                  "|---|---:|---:|---:|---:|---:|"]
        for mode, e in s["modes"].items():
            hidden = f"{e['hidden_fraction']:+.2f}" if "hidden_fraction" in e else ""
            eff = _efficiency(s, mode)
            eff = "" if eff is None else f"{eff:+.2f}"
            lines.append(f"| {mode} | {e['step_ms']:.2f} | {e['backward_ms']:.2f} | "
                         f"{e['exposed_comm_ms']:.2f} | {hidden} | {eff} |")
        lines.append("")
    return lines


def _efficiency(s: dict, mode: str) -> float | None:
    """The JSON's efficiency, or (a run from before it was written) the same from its medians."""
    from mpidp.bench.overlap import BASELINES, efficiency

    m = s["modes"]
    if mode in BASELINES or not {"compute", "serial"} <= m.keys():
        return None
    return m[mode].get("efficiency", efficiency(m["serial"], m["compute"], m[mode]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="docs/bench", help="where the JSON/text files are")
    p.add_argument("--img", default="docs/img", help="where to draw the PNGs")
    p.add_argument("--out", default="docs/benchmarks.md")
    p.add_argument("--notes", default="docs/benchmarks-notes.md",
                   help="hand-written analysis included verbatim, if the file exists")
    p.add_argument("--note", default="", help="a banner line at the top (e.g. 'preliminary')")
    p.add_argument("--title", default="Benchmarks", help="the page's heading")
    p.add_argument("--merged", action="store_true", help="also write each rank count's runs "
                   "merged (medians over runs) as collectives-n<N>.json in --data, the one "
                   "file per rank count that `python -m mpidp.sim predict --compare` reads")
    p.add_argument("--readme", default="", help=f"update the headline between {README_BEGIN} "
                   f"and {README_END} in this file")
    p.add_argument("--overlap-doc", default="", help=f"update the tables between "
                   f"{OVERLAP_BEGIN} and {OVERLAP_END} in this file from overlap-n*.json")
    p.add_argument("--baseline", default="", help="a folder of previously committed "
                   "collectives-n*.json: the targets' 'before' column")
    p.add_argument("--see-also", action="append", default=[], metavar="PAGE",
                   help="link this page (another MPI library's) at the top, if it exists")
    args = p.parse_args(argv)
    runs = load_runs(args.data)
    if not runs:
        p.error(f"no collectives-n*.json in {args.data}")
    if args.merged:
        for run in runs:
            if run.get("runs", 1) > 1:
                write_json(os.path.join(args.data, f"collectives-n{run['ranks']}.json"),
                           {k: v for k, v in run.items() if k != "rows"}, run["rows"])
    os.makedirs(args.img, exist_ok=True)
    images = {}
    for run in runs:
        images[run["ranks"]] = os.path.join(args.img, f"collectives-n{run['ranks']}.png")
        plot(run["rows"], run, images[run["ranks"]])
    notes_text = ""
    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as f:
            notes_text = f.read()
    out_dir = os.path.dirname(os.path.abspath(args.out))
    baseline = load_runs(args.baseline) if args.baseline else []
    page = render(runs, {k: os.path.abspath(v) for k, v in images.items()},
                  os.path.abspath(args.data), out_dir, args.note, notes_text, baseline,
                  [os.path.abspath(p) for p in args.see_also], args.title)
    files.write_text(args.out, page)
    _, met, total = target_table(runs)
    print(f"wrote {args.out} ({met} of {total} judged targets met) and "
          f"{len(images)} plot(s) in {args.img}")
    if args.readme and update_readme(args.readme, runs):
        print(f"updated the headline in {args.readme}")
    overlap = sorted(glob.glob(os.path.join(args.data, "overlap-n*.json")), key=ranks_of)
    if args.overlap_doc and overlap and replace_marked(args.overlap_doc, OVERLAP_BEGIN,
                                                       OVERLAP_END, overlap_tables(overlap)):
        print(f"updated the tables in {args.overlap_doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

