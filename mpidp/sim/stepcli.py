"""python -m mpidp.sim step | profile: the flags, the model's buckets, the table and the JSON.

    python -m mpidp.sim profile --model gpt --batch 8 -o gpt-profile.json
    python -m mpidp.sim step --model gpt --ranks 2,16,128 --ppn 8 --rate 100 \\
        --profile gpt-profile.json [--no-overlap] [--zero 1|3 [--prefetch]] [--json F]

The model flags are the trainers' (train_mlp.py, train_gpt.py: the same names and
defaults; `--vocab` stands for the corpus's byte vocabulary, 256 at most). A bad flag,
or a profile that is not one or was measured for another model, is one line and exit
code 2, as the trainers say theirs. Without --profile the step's compute is measured
here first, on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys

from mpidp import cli, files
from mpidp.collectives import ALGORITHMS
from mpidp.training import hooks, outputs
from mpidp.training.buckets import make_buckets, writers
from mpidp.training.pieces import HIGH, LOW
from mpidp.training.trainer import piece_mb
from mpidp.untrusted import InputError

from . import hookstep, zero3step
from . import profile as prof
from .step import Net, Reduction, choose, predict

MiB = 1 << 20
MEASURED = 32  # the most samples a profile measured here runs (times scale with samples)
DEFAULTS = {"mlp": {"global_batch": 64, "bucket_mb": 25.0, "optimizer": "sgd"},
            "gpt": {"global_batch": 24, "bucket_mb": 0.1, "optimizer": "adamw"}}


def model_flags(p) -> None:
    """The trainers' model flags (train_mlp.py's, train_gpt.py's), with their defaults."""
    count = cli.number(int, 1)
    p.add_argument("--model", default="mlp", choices=["mlp", "gpt"], help="which trainer")
    p.add_argument("--hidden", type=cli.counts, default="128,64", help="mlp: hidden widths")
    p.add_argument("--activation", default="relu", choices=["relu", "tanh"], help="mlp")
    p.add_argument("--data", default="digits", choices=sorted(prof.MLP_DATA),
                   help="mlp: its inputs' and classes' sizes")
    p.add_argument("--layers", type=count, default=2, help="gpt: transformer blocks")
    p.add_argument("--heads", type=count, default=4, help="gpt: attention heads per block")
    p.add_argument("--width", type=count, default=64, help="gpt: channels, a multiple of --heads")
    p.add_argument("--context", type=count, default=64, help="gpt: tokens per sample")
    p.add_argument("--vocab", type=cli.number(int, 1), default=256, help="gpt: tokens")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"],
                   help="the update (default: the trainer's, sgd or adamw)")


def parser() -> cli.Parser:
    count, nonneg = cli.number(int, 1), cli.number(float, 0)
    p = cli.Parser(prog="python -m mpidp.sim step", description=__doc__.split("\n")[0])
    model_flags(p)
    p.add_argument("--global-batch", type=count, help="samples per step, all ranks "
                   "(default: the trainer's, 64 or 24)")
    p.add_argument("--accum-steps", type=count, default=1, help="micro-batches per step")
    p.add_argument("--bucket-mb", type=nonneg, help="bucket cap (default: the trainer's, "
                   "25 or 0.1); 0: one bucket per unit")
    p.add_argument("--first-bucket-mb", type=nonneg, default=1.0)
    p.add_argument("--piece-mb", type=piece_mb, default="auto", help="mlp, --zero 0: pieces "
                   "of a layer reduced as backward writes them (auto: across hosts only)")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    p.add_argument("--prefetch", action="store_true", help="--zero 3: each unit's all-gather "
                   "starts while the one before it computes")
    p.add_argument("--no-overlap", action="store_true", help="all-reduce after backward")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS["allreduce"])
    p.add_argument("--comm-hook", type=hookcli, default=["none"], metavar="HOOK,...",
                   help="a row per hook (" + "|".join(hooks.HOOKS) + "), and the link rate "
                   "below which each pays (docs/training.md)")
    p.add_argument("--ranks", type=cli.counts, default="2", help="N, e.g. 2,16,16384")
    p.add_argument("--ppn", type=count, default=1, help="ranks per host (dividing N)")
    p.add_argument("--rate", type=cli.number(float, 0, above=True), default=10.0,
                   help="a host link's rate, Gbit/s")
    p.add_argument("--latency", type=nonneg, default=20e-6, help="s per message between hosts")
    p.add_argument("--calibration", help="`python -m mpidp.bench calibrate` output: alpha, "
                   "beta, gamma within a host (default 15 us, 0.5 ns/B, 1 ns/B)")
    p.add_argument("--profile", help="a `python -m mpidp.sim profile` file (default: measure now)")
    p.add_argument("--json", metavar="FILE", help="write the prediction as JSON here")
    p.add_argument("--draw", metavar="FILE.png", help="draw the predicted step (the last N)")
    return p


def hookcli(text: str) -> list[str]:
    """--comm-hook's argparse type: names, comma-separated, each checked (`hooks.flag`)."""
    return list(dict.fromkeys(hooks.flag(name) for name in text.split(",")))


def profile_parser() -> cli.Parser:
    p = cli.Parser(prog="python -m mpidp.sim profile", description=prof.__doc__.split("\n")[0])
    model_flags(p)
    p.add_argument("--batch", type=cli.number(int, 1), default=8, help="samples per run")
    p.add_argument("--repeats", type=cli.number(int, 1), default=5)
    p.add_argument("-o", "--output", required=True, help="the JSON file to write")
    return p


def shape(args) -> list[int]:
    """The model's shape as `profile.build` takes it."""
    if args.model == "mlp":
        features, classes = prof.MLP_DATA[args.data]
        return [features, *args.hidden, classes]
    if args.width % args.heads:
        raise cli.UsageError(f"--width {args.width} is not a multiple of --heads {args.heads}")
    return [args.vocab, args.context, args.layers, args.heads, args.width]


def checked(args) -> None:
    """The rules between flags (a `cli.UsageError`, one line)."""
    defaults = DEFAULTS[args.model]
    for name, value in defaults.items():
        if getattr(args, name, 0) is None:
            setattr(args, name, value)
    if args.prefetch and args.zero != 3:
        raise cli.UsageError("--prefetch: models stage 3's (--zero 3) only")
    if args.zero and args.algorithm not in ("auto", "ring", "rabenseifner"):
        raise cli.UsageError(f"--zero {args.zero} runs reduce-scatter + all-gather: "
                             "--algorithm must be one of auto, ring, rabenseifner")
    for name in args.comm_hook:
        if why := hooks.refused(hooks.parse(name), args.zero, False, [args.dtype], False):
            raise cli.UsageError(why)
    problem = outputs.check({"--json": args.json, "--draw": args.draw}, appended=())
    if problem:  # before any work: the trainers' check of their output files
        raise cli.UsageError(problem)
    if args.draw and os.path.splitext(args.draw)[1].lower() not in (".png", ".svg", ".pdf"):
        raise cli.UsageError(f"--draw {args.draw}: a .png, .svg or .pdf to draw")
    for N in args.ranks:
        if N % args.ppn:
            raise cli.UsageError(f"--ppn {args.ppn} does not divide --ranks {N} (equal hosts)")
        if args.global_batch < N * args.accum_steps:
            raise cli.UsageError(f"--global-batch {args.global_batch}: fewer than one sample "
                                 f"per rank and micro-batch on {N} ranks")


def reductions(m, args, N: int, net: Net, cache: dict) -> list[Reduction]:
    """The buckets DataParallel makes of the model (`make_buckets`), or their pieces."""
    cap = args.bucket_mb * MiB
    buckets = make_buckets(m, cap, min(args.first_bucket_mb, args.bucket_mb) * MiB)
    ppn = 0 if args.ppn >= N else args.ppn
    size = args.piece_mb
    if size == "auto":  # as pieces.piece_bytes: only across hosts, sized by the cost model
        size = piece_size(args, N, ppn, net, cache) if N > args.ppn else None
    elif size is not None:
        size = int(size * MiB)
    if size is None or args.model != "mlp" or args.zero:
        return [Reduction(f"bucket {b.index}", b.units[-1], 1.0, int(b.flat.nbytes))
                for b in buckets]
    out = []
    for b in buckets:
        for i in b.units:  # W (in, out) in row blocks, then b with the last block
            n_in, n_out = m.grads[f"W{i}"].shape
            item = m.grads[f"W{i}"].itemsize
            rows = max(1, round(size / (n_out * item)))
            stops, last = [*range(rows, n_in, rows), n_in], 0
            dx = 0.5 if i > 1 else 1.0  # dW's blocks take about half of a layer's backward
            for stop in stops:
                nbytes = (stop - last) * n_out * item + (n_out * item if stop == n_in else 0)
                out.append(Reduction(f"bucket {b.index} piece", i, dx * stop / n_in, nbytes))
                last = stop
    return out


def piece_size(args, N: int, ppn: int, net: Net, cache: dict) -> int:
    """`pieces.piece_bytes`' rule on this network: overhead at most a tenth of byte time."""
    one, two = (choose("allreduce", args.algorithm, n, N, ppn, net, cache)
                for n in (MiB, 2 * MiB))
    per_byte = (two.fixed + two.wire - one.fixed - one.wire) / MiB
    overhead = one.fixed + one.wire - per_byte * MiB
    return HIGH if per_byte <= 0 else int(min(HIGH, max(LOW, 10 * overhead / per_byte)))


def network(args, rate: float | None = None) -> Net:
    net = Net(alpha_link=args.latency, beta_link=8 / ((rate or args.rate) * 1e9))
    if args.calibration:
        from .predict import read_calibration

        c = read_calibration(args.calibration)
        net = net._replace(alpha=c.alpha, beta=c.beta, gamma=c.gamma, fixed=c.fixed)
    return net


def scaled(profile: dict, batch: float) -> list[tuple[int, float, float]]:
    """The profile's units for `batch` samples (times linear in samples)."""
    k = batch / profile["batch"]
    return [(u["unit"], u["forward_s"] * k, u["backward_s"] * k) for u in profile["units"]]


def run(args) -> list[dict]:
    """The predicted step for each N of --ranks (rows of `format_rows`)."""
    m = prof.build(args.model, shape(args), args.dtype, args.activation)
    if args.profile:
        found = prof.read(args.profile)
        prof.matches(found, args.profile, args.model, shape(args), args.dtype, m)
    else:
        batch = min(MEASURED, max(1, args.global_batch // args.ranks[0]))  # then scaled
        found = prof.measure(args.model, shape(args), batch, args.dtype, args.optimizer)
    net, cache, rows = network(args), {}, []
    hooked = hookstep.hooked(m, args)
    for N in args.ranks:
        batch = args.global_batch / (N * args.accum_steps)
        for name in args.comm_hook:
            h = hooked[name]
            row = one(args, m, found, h, N, batch, net, cache,
                      timeline=bool(args.draw) and N == args.ranks[-1])
            if h.hook is not None and N > args.ppn:  # the rate it pays below, other flags kept
                row["pays"] = hookstep.crossover(lambda rate, h=h, N=N, b=batch: tuple(
                    one(args, m, found, x, N, b, network(args, rate), cache)["step_s"]
                    for x in (h, hooked["none"])))
            rows.append(row)
    return rows


def one(args, m, found: dict, h, N: int, batch: float, net: Net, cache: dict,
        timeline: bool = False) -> dict:
    """The predicted step on N ranks with hook `h` (a `hookstep.Hooked`)."""
    if args.zero == 3:
        row = zero3(args, m, found, N, batch, net, cache, timeline)
        row["samples_per_s"], row["hook"] = args.global_batch / row["step_s"], h.name
        return row
    whole = vars(args) | {"piece_mb": None}  # a hook reduces whole buckets
    plan = reductions(m, args if h.hook is None else argparse.Namespace(**whole), N, net, cache)
    row = predict(scaled(found, batch), plan, found["update_s"], N, args.ppn, net,
                  args.algorithm, not args.no_overlap, args.zero, args.accum_steps, cache,
                  timeline=timeline, cost_of=h.cost_of(N, 0 if args.ppn >= N else args.ppn,
                                                        net, cache))
    row["samples_per_s"], row["hook"] = args.global_batch / row["step_s"], h.name
    return row


def zero3(args, m, found: dict, N: int, batch: float, net: Net, cache: dict,
          timeline: bool) -> dict:
    """Stage 3's step (`zero3step.py`): one bucket per unit, as `DataParallel` makes them."""
    buckets = make_buckets(m, 0, 0)
    needs = {i: [b.index for b in bs] for i, bs in writers(m, buckets).items()}
    return zero3step.predict(scaled(found, batch), needs, {b.units[-1]: b.index for b in buckets},
                             [int(b.flat.nbytes) for b in buckets], found["update_s"], N,
                             args.ppn, net, args.algorithm, args.prefetch, args.accum_steps,
                             cache, timeline)


def format_rows(rows: list[dict]) -> str:
    """The Markdown table of `run`'s rows (a hook column where a hook was asked), then the
    rate below which each hook pays."""
    hooked = any(r["hook"] != "none" for r in rows)
    lines = ["| N | hosts × ranks | " + "hook | " * hooked + "algorithm | step ms | compute ms | "
             "communication ms | exposed ms | hidden | bytes per link | samples/s |",
             "|---:|:---|" + ":---|" * hooked + ":---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        hosts, hook = r["N"] // r["ppn"], f" {r['hook']} |" * hooked
        lines.append(f"| {r['N']} | {hosts} × {r['ppn']} |{hook} "
                     f"{'+'.join(r['algorithms']) or '-'} "
                     f"| {r['step_s'] * 1e3:.3f} | {r['compute_s'] * 1e3:.3f} | "
                     f"{r['communication_s'] * 1e3:.3f} | {r['exposed_s'] * 1e3:.3f} | "
                     f"{r['hidden']:.0%} | {r['link_bytes'] / 1e6:.3f} MB | "
                     f"{r['samples_per_s']:.0f} |")
    lines += [f"{r['hook']} on {r['N']} ranks: {r['pays']}" for r in rows if "pays" in r]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    p = parser() if command == "step" else profile_parser()
    try:
        args = p.parse_args(rest)
        if command == "profile":
            args.optimizer = args.optimizer or DEFAULTS[args.model]["optimizer"]
            prof.write(args.output, prof.measure(args.model, shape(args), args.batch,
                                                 args.dtype, args.optimizer, args.repeats,
                                                 args.activation))
            print(f"wrote {args.output}")
            return 0
        checked(args)
        rows = run(args)
    except (cli.UsageError, InputError, files.WriteError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    try:
        if args.json:
            files.write_json(args.json, {"rows": [{k: v for k, v in r.items() if k not in
                                                   ("spans", "rounds")} for r in rows]})
        if args.draw:
            from .stepdraw import draw

            draw(rows[-1], args.draw, f"sim step: {args.model}, N = {rows[-1]['N']}")
            print(f"wrote {args.draw}")
    except (files.WriteError, ValueError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0

