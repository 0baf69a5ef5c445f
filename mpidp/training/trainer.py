"""What the example trainers share: their flags and checks, the optimizer, checkpoints, deadlines.

``examples/train_mlp.py`` and ``examples/train_gpt.py`` differ in their model, their
data and what they measure; the rest is here, once:

    p = trainer.parser(PROG, doc, DEFAULT_LR, epochs=12, global_batch=64)
    p.add_argument(...)                         # the model's and the data's own flags
    main = trainer.main(PROG, parse_args, train)  # usage errors, watchdog, BLAS threads

- `parser` adds the flags every trainer has (`--epochs`/`--max-steps`,
  `--global-batch`, `--accum-steps`, `--bucket-mb`, `--algorithm`, `--zero`,
  `--optimizer`, `--checkpoint`/`--resume`/`--overwrite`, `--metrics`, `--trace`,
  `--dtype`, `--progress`, ...; `stepflags`: `--uneven`, `--clip-grad`) and `checked`
  the rules between them: a bad command line is one line on rank 0, exit 2 on every rank;
- `problems` finds, on rank 0, an output file that could not be written (`outputs`);
- `resume.start_from` (its own module) loads a checkpoint written by the same run, or
  says why not;
- `data_parallel` builds `DataParallel` from the flags; `Saver` writes checkpoints
  (the ZeRO shards gathered first: a collective); `end_step` is what follows each
  optimizer step (watchdog, trace, replica check, checkpoint, the stop at `--max-steps`);
- `Progress` (from progress.py) is rank 0's bar or lines; `blas_threads` keeps BLAS to
  its share of cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext

from mpi4py import MPI

from .. import cli, config, watchdog
from ..collectives import ALGORITHMS
from . import checkpoint, hooks, outputs, stepflags
from .ddp import DataParallel
from .determinism import default_micro_batch, micro_shards
from .optim import OPTIMIZERS, SGD
from .progress import Progress  # noqa: F401 - a trainer's bar or lines, trainer.Progress
from .zero import HALVES


def piece_mb(text: str) -> float | str | None:
    """An argparse type: "auto", "none", or a finite size in MiB above 0."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        return cli.number(float, 0, above=True)(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: auto, none or a size in MiB above 0") from None


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help with every flag's default, but where there is none to show (None, False)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def rates(default_lr: dict) -> str:
    """The default learning rates in words: ``0.05 with sgd, 0.001 with adam or adamw``."""
    by_rate = {}
    for name, lr in default_lr.items():
        by_rate.setdefault(lr, []).append(name)
    return ", ".join(f"{lr:g} with {' or '.join(names)}" for lr, names in by_rate.items())


def parser(prog: str, description: str, default_lr: dict, *, epochs: int, global_batch: int,
           optimizer: str = "sgd", bucket_mb: float = 25.0,
           metrics_help: str = "JSON lines") -> cli.Parser:
    """A `cli.Parser` holding the flags every trainer has, with this trainer's defaults."""
    count, count0 = cli.number(int, 1), cli.number(int, 0)  # >= 1, >= 0
    positive, nonnegative = cli.number(float, 0, above=True), cli.number(float, 0)
    p = cli.Parser(prog=prog, description=description, formatter_class=Help)
    p.set_defaults(default_lr=default_lr)
    p.add_argument("--epochs", type=count, default=epochs, help="passes over the training set")
    p.add_argument("--global-batch", type=count, default=global_batch,
                   help="samples per step, all ranks")
    p.add_argument("--optimizer", default=optimizer, choices=list(OPTIMIZERS), help="the update")
    p.add_argument("--lr", type=positive, default=None,
                   help=f"learning rate (default: {rates(default_lr)})")
    p.add_argument("--momentum", type=nonnegative, default=0.9, help="SGD's")
    p.add_argument("--beta1", type=nonnegative, default=0.9, help="Adam's and AdamW's, < 1")
    p.add_argument("--beta2", type=nonnegative, default=0.999, help="Adam's and AdamW's, < 1")
    p.add_argument("--eps", type=nonnegative, default=1e-8, help="Adam's and AdamW's")
    p.add_argument("--weight-decay", type=nonnegative, default=1e-4,
                   help="L2 (SGD, Adam) or decoupled (AdamW)")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3],
                   help="ZeRO stage: 1 shards the optimizer state, 2 the gradients too, "
                        "3 the parameters too")
    p.add_argument("--seed", type=count0, default=0,
                   help="the initial weights' and the data order's")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="of the parameters, gradients and activations")
    p.add_argument("--no-overlap", action="store_true", help="all-reduce after backward")
    p.add_argument("--progress-thread", nargs="?", const="poll", default=None,
                   choices=["wait", "poll"],
                   help="advance the reductions from a background thread too: bare or "
                        "poll, one that polls every 100 us; wait, one that blocks in MPI on "
                        "them (default: none; docs/overlap.md)")
    p.add_argument("--piece-mb", type=piece_mb, default="auto",
                   help="reduce each layer's gradient in pieces of this many MiB as backward "
                        "writes them (auto: across hosts only, sized by the cost model; "
                        "none: whole buckets; docs/overlap.md)")
    p.add_argument("--comm-hook", type=hooks.flag, default="none", metavar="HOOK",
                   help="what a bucket sends: " + "|".join(hooks.HOOKS) + " (docs/training.md)")
    p.add_argument("--bucket-mb", type=nonnegative, default=bucket_mb,
                   help="0: one bucket per layer")
    p.add_argument("--first-bucket-mb", type=nonnegative, default=1.0,
                   help="the first bucket's size: small, so that its all-reduce starts early")
    p.add_argument("--accum-steps", type=count, default=1, help="micro-batches per step")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS["allreduce"],
                   help="the all-reduce's (auto: by the cost model)")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                   help="where the model computes (gpu: CuPy)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto) here")
    p.add_argument("--checkpoint", metavar="FILE", help="save here after every epoch")
    p.add_argument("--checkpoint-every", type=count0, default=0, metavar="STEPS",
                   help="also save every STEPS optimizer steps")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --checkpoint (without --resume)")
    p.add_argument("--max-steps", type=count0, default=0,
                   help="stop after this many optimizer steps in all (0: run every epoch)")
    p.add_argument("--metrics", metavar="FILE", help=metrics_help)
    p.add_argument("--progress", default="auto",
                   choices=["auto", "bar", "lines", "always", "never"],
                   help="rank 0's progress through each epoch: a bar redrawn in place "
                        "(always: the same), lines on stdout, or none; auto: the bar on a "
                        "terminal, lines elsewhere (under mpiexec)")
    p.add_argument("--progress-every", type=nonnegative, default=10.0, metavar="SECONDS",
                   help="--progress lines: at most one line per SECONDS")
    p.add_argument("--debug", action="store_true", help="check replicas are identical")
    p.add_argument("--blas-threads", type=count, default=1, help="BLAS threads per rank")
    p.add_argument("--deterministic", action="store_true",
                   help="N ranks train bitwise like 1 rank on the global batch")
    p.add_argument("--micro-batch", type=count, default=None, metavar="M",
                   help="--deterministic's micro-shard size (default: from the global batch "
                        "alone, see mpidp.training.determinism.default_micro_batch)")
    stepflags.add_flags(p)  # --uneven, --clip-grad
    return p


def checked(p: cli.Parser, argv=None) -> argparse.Namespace:
    """Parse `argv` and check the rules between the common flags (a `cli.UsageError`)."""
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint FILE")
    if args.beta1 >= 1 or args.beta2 >= 1:
        p.error(f"--beta1 {args.beta1}, --beta2 {args.beta2}: each must be below 1")
    if args.zero and args.algorithm not in HALVES:
        p.error(f"--zero {args.zero} runs reduce-scatter + all-gather: --algorithm must be "
                f"one of {', '.join(HALVES)}")
    if why := hooks.args_refused(args):
        p.error(why)
    if args.micro_batch is not None and not args.deterministic:
        p.error("--micro-batch is --deterministic's micro-shard size: pass --deterministic")
    if args.deterministic:
        if args.device == "gpu":
            p.error("--deterministic runs on the CPU only (GPU libraries pick kernels by "
                    "heuristics)")
        if args.blas_threads > 1:
            p.error("--deterministic needs one BLAS thread per rank (--blas-threads 1)")
        if args.accum_steps > 1:
            p.error("--deterministic accumulates its micro-shards itself: size them with "
                    "--micro-batch, not --accum-steps")
        if args.micro_batch is None:
            args.micro_batch = default_micro_batch(args.global_batch)
    if args.lr is None:
        args.lr = args.default_lr[args.optimizer]
    return args


def micro_batches(args: argparse.Namespace, size: int) -> int:
    """A, the micro-batches per rank and step: --accum-steps, or with --deterministic the
    micro-shards of --micro-batch samples (ValueError unless they divide the rank's batch)."""
    if args.deterministic:
        return micro_shards(args.global_batch, size, args.micro_batch)
    return args.accum_steps


def make_optimizer(args: argparse.Namespace, model):
    """The optimizer the flags ask for, on the model's dicts (DataParallel shards it)."""
    if args.optimizer == "sgd":
        return SGD(model.params, model.grads, args.lr, args.momentum, args.weight_decay)
    return OPTIMIZERS[args.optimizer](model.params, model.grads, args.lr,
                                      (args.beta1, args.beta2), args.eps, args.weight_decay)


def problems(args: argparse.Namespace, rank: int) -> str | None:
    """Rank 0's check of the output files (the temporary checkpoint's name holds its pid)."""
    if rank != 0:
        return None
    return outputs.check({"--metrics": args.metrics, "--trace": args.trace,
                          "--checkpoint": args.checkpoint}, checkpoint="--checkpoint",
                         replace=args.resume or args.overwrite)


def data_parallel(args: argparse.Namespace, model, comm, opt, tracer) -> DataParallel:
    """`DataParallel` (with --zero, ZeRO's reducer) as the flags ask, followed by `tracer`;
    with --debug, the replicas checked after the broadcast."""
    ddp = DataParallel(model, comm, args.bucket_mb, args.first_bucket_mb, not args.no_overlap,
                       args.algorithm, args.progress_thread or False, zero=args.zero,
                       optimizer=opt, deterministic=args.deterministic, piece_mb=args.piece_mb,
                       comm_hook=args.comm_hook)
    if args.debug:
        ddp.check_replicas()
    if tracer is not None:
        tracer.follow(ddp)
    return ddp


def finish(args: argparse.Namespace, ddp: DataParallel, tracer, comm, dog, rank: int) -> None:
    """The end of a run (collective): gather and write the trace, close `ddp`, and say, as
    rank 0's last line, where the timeline is and how to draw it with this python."""
    if tracer is not None:
        tracer.write(args.trace, comm)
        dog.kick()
    ddp.close()
    if tracer is not None and rank == 0:
        python = os.path.relpath(sys.executable)  # this python: the one with mpidp installed
        python = sys.executable if python.startswith("..") else python
        print(f"trace: {args.trace} (open it in https://ui.perfetto.dev, or draw one step: "
              f"{python} -m mpidp.trace plot {args.trace} -o timeline.png)")


def end_step(args: argparse.Namespace, ddp: DataParallel, dog, tracer, started: float,
             save: Callable[[], None]) -> bool:
    """What every trainer does once `ddp.step()` (begun at `started`) has returned.

    The watchdog is kicked, the tracer gets the optimizer's span, `--debug` compares
    the replicas (`DataParallel.check_replicas`), and `save()` writes the checkpoint
    every `--checkpoint-every` steps and at the last one. True once `--max-steps`
    steps are done.
    """
    dog.kick()
    if tracer is not None:
        tracer.add(args.optimizer, started, time.perf_counter(), "optimizer")
    if args.debug:
        ddp.check_replicas()
    steps = ddp.optimizer.steps
    stop = bool(args.max_steps) and steps >= args.max_steps
    if stop or (args.checkpoint_every and steps % args.checkpoint_every == 0):
        save()
    return stop


class Saver:
    """``save(epoch, step)``: the checkpoint of `ddp`'s model, written by rank 0 (collective),
    recording the run's `settings` (`resume.settings`)."""

    def __init__(self, args: argparse.Namespace, ddp: DataParallel, opt, rank: int,
                 settings: dict):
        self.args, self.ddp, self.opt, self.rank = args, ddp, opt, rank
        self.settings = settings

    def __call__(self, epoch: int, step: int) -> None:
        if not self.args.checkpoint:
            return
        whole = self.ddp.full_optimizer() if self.args.zero else self.opt  # gathered
        with self.ddp.gathered():  # --zero 3: the parameters too (collective)
            if self.rank == 0:
                checkpoint.save(self.args.checkpoint, self.ddp.model, whole,
                                {"epoch": epoch, "step": step}, self.settings)


def blas_threads(n: int):
    """Limit the BLAS thread pool to `n` threads (the ranks of a node share its cores): a
    context manager, or applied at once if called alone. threadpoolctl (scikit-learn
    brings it) is optional: without it, nothing is limited."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def main(prog: str, parse_args: Callable, train: Callable) -> Callable:
    """A trainer's ``main(argv=None) -> exit code``: `parse_args`, then `train(args, comm, dog)`.

    A usage error (a bad flag, a bad MPIDP_* variable) is exit code 2 on every rank; then
    every collective runs under a deadline, and an exception on one rank ends the job.
    """
    def run(argv=None) -> int:
        comm = MPI.COMM_WORLD
        try:  # the same argv and environment on every rank: all return 2 together
            args = parse_args(argv)
            config.check()  # a bad MPIDP_* variable (MPIDP_TIMEOUT, ...) is a usage error too
        except (cli.UsageError, ValueError) as e:
            return cli.usage_error(prog, e)
        with watchdog.guard("auto", "training") as dog, blas_threads(args.blas_threads):
            return train(args, comm, dog)
    return run
