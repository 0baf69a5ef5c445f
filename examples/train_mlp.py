"""Train an MLP on handwritten digits with data parallelism over MPI ranks.

    mpiexec -n 4 python examples/train_mlp.py
    mpiexec -n 4 python examples/train_mlp.py --hidden 256,128 --no-overlap --trace run.json
    mpiexec -n 2 python examples/train_mlp.py --checkpoint ck.npz --epochs 5
    mpiexec -n 4 python examples/train_mlp.py --checkpoint ck.npz --epochs 10 --resume
    mpiexec -n 4 python examples/train_mlp.py --zero 2 --optimizer adam   # ZeRO stage 2
    mpiexec -n 3 python examples/train_mlp.py --deterministic   # the bits of 1 rank

The global batch is split over the ranks (and over --accum-steps micro-batches
on each), so the same --global-batch and --seed give the same training whatever
the number of ranks: to rounding by default, bitwise with --deterministic (the
global batch cut into micro-shards of --micro-batch samples, summed exactly).
Rank 0 prints one line per epoch and writes --metrics.

A bad flag or MPIDP_TIMEOUT, an output path rank 0 cannot write, an existing
--checkpoint without --resume or --overwrite, or a checkpoint that cannot be
resumed: rank 0 says so in one line and every rank exits with code 2, before
any training. After that, an exception on any rank ends the whole job, and so
does a stretch with no progress longer than the deadline (MPIDP_TIMEOUT seconds,
or by default max(60 s, 10 x the longest seen), see mpidp.watchdog.guard).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack, nullcontext

import numpy as np
from mpi4py import MPI

import mpidp
from mpidp import cli, watchdog
from mpidp.trace import Tracer
from mpidp.training import MLP, SGD, DataParallel, ShardSampler, checkpoint, data
from mpidp.training.checkpoint import CheckpointError
from mpidp.training.determinism import default_micro_batch, micro_shards
from mpidp.training.memory import StepPeak, model_state_bytes
from mpidp.training.mlp import array_module, softmax_cross_entropy
from mpidp.training.optim import OPTIMIZERS
from mpidp.training.zero import HALVES

PROG = "train_mlp.py"


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, each checked here: a bad one is a `cli.UsageError`, the same on every rank."""
    count, count0 = cli.number(int, 1), cli.number(int, 0)  # >= 1, >= 0
    positive, nonnegative = cli.number(float, 0, above=True), cli.number(float, 0)
    p = cli.Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=count, default=12)
    p.add_argument("--global-batch", type=count, default=64, help="samples per step, all ranks")
    p.add_argument("--optimizer", default="sgd", choices=list(OPTIMIZERS))
    p.add_argument("--lr", type=positive, default=None,
                   help=f"learning rate (default: {DEFAULT_LR})")
    p.add_argument("--momentum", type=nonnegative, default=0.9, help="SGD's")
    p.add_argument("--beta1", type=nonnegative, default=0.9, help="Adam's and AdamW's, < 1")
    p.add_argument("--beta2", type=nonnegative, default=0.999, help="Adam's and AdamW's, < 1")
    p.add_argument("--eps", type=nonnegative, default=1e-8, help="Adam's and AdamW's")
    p.add_argument("--weight-decay", type=nonnegative, default=1e-4,
                   help="L2 (SGD, Adam) or decoupled (AdamW)")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2],
                   help="ZeRO stage: 1 shards the optimizer state, 2 the gradients too")
    p.add_argument("--hidden", type=cli.counts, default="128,64",
                   help="hidden widths, e.g. 128,64")
    p.add_argument("--activation", default="relu", choices=["relu", "tanh"])
    p.add_argument("--seed", type=count0, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--data", default="digits", choices=["digits", "synthetic"])
    p.add_argument("--no-overlap", action="store_true", help="all-reduce after backward")
    p.add_argument("--progress-thread", action="store_true",
                   help="advance all-reduces from a background thread too")
    p.add_argument("--bucket-mb", type=nonnegative, default=25.0,
                   help="0: one bucket per layer")
    p.add_argument("--first-bucket-mb", type=nonnegative, default=1.0)
    p.add_argument("--accum-steps", type=count, default=1, help="micro-batches per step")
    p.add_argument("--algorithm", default="auto", choices=mpidp.ALGORITHMS["allreduce"])
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (Perfetto) here")
    p.add_argument("--checkpoint", metavar="FILE", help="save here after every epoch")
    p.add_argument("--checkpoint-every", type=count0, default=0, metavar="STEPS",
                   help="also save every STEPS optimizer steps")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --checkpoint (without --resume)")
    p.add_argument("--max-steps", type=count0, default=0,
                   help="stop after this many optimizer steps in all (0: run every epoch)")
    p.add_argument("--metrics", metavar="FILE", help="JSON lines, one object per epoch")
    p.add_argument("--progress", default="auto", choices=["auto", "always", "never"],
                   help="progress bar on rank 0 (auto: on a terminal, for epochs over 1 s)")
    p.add_argument("--debug", action="store_true", help="check replicas are identical")
    p.add_argument("--blas-threads", type=count, default=1, help="BLAS threads per rank")
    p.add_argument("--deterministic", action="store_true",
                   help="N ranks train bitwise like 1 rank on the global batch")
    p.add_argument("--micro-batch", type=count, default=None, metavar="M",
                   help="--deterministic's micro-shard size (default: from the global batch "
                        "alone, see mpidp.training.determinism.default_micro_batch)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint FILE")
    if args.beta1 >= 1 or args.beta2 >= 1:
        p.error(f"--beta1 {args.beta1}, --beta2 {args.beta2}: each must be below 1")
    if args.zero and args.algorithm not in HALVES:
        p.error(f"--zero {args.zero} runs reduce-scatter + all-gather: --algorithm must be "
                f"one of {', '.join(HALVES)}")
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
        args.lr = DEFAULT_LR[args.optimizer]
    return args


DEFAULT_LR = {"sgd": 0.05, "adam": 1e-3, "adamw": 1e-3}


def make_optimizer(args: argparse.Namespace, model):
    """The optimizer the flags ask for, on the model's dicts (DataParallel shards it)."""
    if args.optimizer == "sgd":
        return SGD(model.params, model.grads, args.lr, args.momentum, args.weight_decay)
    return OPTIMIZERS[args.optimizer](model.params, model.grads, args.lr,
                                      (args.beta1, args.beta2), args.eps, args.weight_decay)


def check_outputs(args: argparse.Namespace) -> str | None:
    """What stops rank 0 from writing its files, found now rather than after training."""
    for flag in ("metrics", "trace", "checkpoint"):
        path = getattr(args, flag)
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            return f"--{flag} {path}: there is no folder {folder}"
        if os.path.isdir(path):
            return f"--{flag} {path} is a folder"
        # the checkpoint is written beside itself, then renamed: it needs the folder
        target = path if os.path.exists(path) and flag != "checkpoint" else folder
        if not os.access(target, os.W_OK):
            return f"--{flag} {path}: {target} is not writable"
    if args.checkpoint and os.path.exists(args.checkpoint) and not (args.resume
                                                                     or args.overwrite):
        return (f"--checkpoint {args.checkpoint} exists: pass --resume to continue from it, "
                "or --overwrite to replace it")
    return None


def resume(path: str, model, opt, run_state: dict) -> tuple[int, int]:
    """Load `path` into the model and optimizer; the epoch and step it was saved at."""
    saved = checkpoint.load(path, model, opt, state_keys=[*run_state, "epoch", "step"])
    for key, value in run_state.items():
        if saved[key] != value:
            raise CheckpointError(f"{path} was written with {key}={saved[key]}, this run has "
                                  f"{value}: the data order would differ")
    return saved["epoch"], saved["step"]


class Progress:
    """A plain-text progress bar on stderr, shown only once an epoch runs for a while."""

    def __init__(self, mode: str, total: int, label: str):
        self.on = mode == "always" or (mode == "auto" and sys.stderr.isatty())
        self.total, self.label = total, label
        self.t0 = self.shown = time.perf_counter()
        self.drawn = False

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if not self.on or now - self.t0 < 1.0 or now - self.shown < 0.2:
            return
        filled = 30 * done // self.total
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                         f"{done}/{self.total} steps")
        sys.stderr.flush()
        self.shown, self.drawn = now, True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * 72 + "\r")
            sys.stderr.flush()


def blas_threads(n: int):
    """One BLAS thread per rank: the ranks of a node share its cores (threadpoolctl is optional)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def main(argv=None) -> int:
    comm = MPI.COMM_WORLD
    try:  # the same argv and environment on every rank: all return 2 together
        args = parse_args(argv)
        watchdog.timeout_from_env()  # a bad MPIDP_TIMEOUT is a usage error too
    except (cli.UsageError, ValueError) as e:
        return cli.usage_error(PROG, e)
    # From here on every collective is under a deadline (MPIDP_TIMEOUT, or the default
    # one, see watchdog.guard), and an exception on one rank ends the whole job.
    with watchdog.guard("auto", "training") as dog, ExitStack() as limits:
        return train(args, comm, dog, limits)


def train(args: argparse.Namespace, comm, dog: watchdog.Dog, limits: ExitStack) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    problem = check_outputs(args) if rank == 0 else None
    xp = array_module(args.device)
    ds = data.digits(seed=args.seed) if args.data == "digits" else data.synthetic(seed=args.seed)
    # after the data: scikit-learn loads a BLAS of its own, which the limit must see too
    limits.enter_context(blas_threads(args.blas_threads))
    dtype = np.dtype(args.dtype)
    x_train, y_train = xp.asarray(ds.x_train.astype(dtype)), xp.asarray(ds.y_train)
    x_test, y_test = ds.x_test[rank::size].astype(dtype), ds.y_test[rank::size]  # my test shard
    x_test, y_test = xp.asarray(x_test), xp.asarray(y_test)
    A = args.accum_steps  # micro-batches per rank and step
    try:
        if args.deterministic:  # the micro-shards: M samples each, contiguous in the global batch
            A = micro_shards(args.global_batch, size, args.micro_batch)
        sampler = ShardSampler(len(ds.y_train), args.global_batch, rank, size, args.seed, A)
    except ValueError as e:
        problem = problem or f"--global-batch: {e}"
    sizes = [ds.features, *args.hidden, ds.classes]
    model = MLP(sizes, args.activation, dtype, seed=args.seed, device=args.device)
    opt = make_optimizer(args, model)
    run_state = {"seed": args.seed, "global_batch": args.global_batch,
                 "accum_steps": args.accum_steps}
    start_epoch, start_step = 0, 0
    if args.resume and problem is None:  # every rank reads the same file
        try:
            start_epoch, start_step = resume(args.checkpoint, model, opt, run_state)
        except CheckpointError as e:
            problem = str(e)
    cli.agree(comm, problem, PROG)  # nothing has been trained or written yet
    tracer = Tracer(rank) if args.trace else None
    ddp = DataParallel(model, comm, args.bucket_mb, args.first_bucket_mb, not args.no_overlap,
                       args.algorithm, args.progress_thread, args.debug, tracer,
                       zero=args.zero, optimizer=opt, deterministic=args.deterministic)
    opt = ddp.optimizer  # with --zero, this rank's shard's (the full one above is dropped)
    if rank == 0:
        print(f"mpidp: {size} rank(s), MLP {sizes} ({model.num_params()} params, {args.dtype}), "
              f"{args.optimizer} lr {args.lr}, zero={args.zero}, "
              f"{len(ddp.buckets)} bucket(s), overlap={not args.no_overlap}, "
              f"algorithm={args.algorithm}, global batch {args.global_batch} = {size} x "
              f"{A} x {sampler.local_batch}, {sampler.steps_per_epoch} steps/epoch"
              + (", deterministic" if args.deterministic else ""))
        if start_epoch or start_step:
            print(f"resumed from {args.checkpoint} at epoch {start_epoch}, step {start_step}")
    metrics = None
    if args.metrics and rank == 0:
        metrics = open(args.metrics, "a" if args.resume else "w")
    comm.Barrier()
    dog.kick()  # set up: the broadcast of the weights and auto's calibration are done
    if tracer is not None:
        tracer.reset_clock()

    def save(epoch: int, step: int) -> None:
        if not args.checkpoint:
            return
        whole = ddp.full_optimizer() if args.zero else opt  # gathered: collective
        if rank == 0:
            checkpoint.save(args.checkpoint, model, whole, {**run_state, "epoch": epoch,
                                                            "step": step})

    stop = False
    for epoch in range(start_epoch, args.epochs):
        batches = sampler.epoch(epoch)  # (steps, A, b) sample indices
        first = start_step if epoch == start_epoch else 0
        # loss sum, correct, samples, forward s, backward s, exposed comm s, steps
        stats = np.zeros(7)
        bar = Progress(args.progress if rank == 0 else "never", sampler.steps_per_epoch,
                       f"epoch {epoch + 1}")
        t_epoch = time.perf_counter()
        peak = None  # bytes at the epoch's last step: model states + what it allocates
        for step in range(first, sampler.steps_per_epoch):
            last = step == sampler.steps_per_epoch - 1 and args.device == "cpu"
            held = model_state_bytes(ddp)["total"] if last else 0
            measured = StepPeak().start() if last else None  # tracemalloc: host arrays
            for a in range(A):
                idx = xp.asarray(batches[step, a])
                x, y = x_train[idx], y_train[idx]  # (b, D), (b,): a contiguous copy
                with ddp.no_sync() if a < A - 1 else nullcontext():
                    t0 = time.perf_counter()
                    logits = ddp.forward(x)  # (b, C)
                    t1 = time.perf_counter()
                    loss, dlogits = softmax_cross_entropy(logits, y)
                    if A > 1 and not args.deterministic:  # (deterministic: DataParallel's)
                        dlogits /= A  # the mean over A micro-batches of b = mean over A*b
                    ddp.backward(dlogits)
                stats[:6] += (loss * len(y), int((logits.argmax(axis=1) == y).sum()), len(y),
                              t1 - t0, ddp.timings["backward"], ddp.timings["exposed_comm"])
            t2 = time.perf_counter()
            ddp.step()
            if measured is not None:
                peak = held + measured.stop()
            dog.kick()
            if tracer is not None:
                tracer.add(args.optimizer, t2, time.perf_counter(), "optimizer")
            stats[6] += 1
            if args.debug:
                ddp.check_replicas()
            stop = args.max_steps and opt.steps >= args.max_steps
            if stop or (args.checkpoint_every and opt.steps % args.checkpoint_every == 0):
                save(epoch, step + 1)
            bar.update(step + 1)
            if stop:
                break
        bar.close()
        if stop:
            break
        elapsed = time.perf_counter() - t_epoch
        correct = xp.asarray(0)
        if len(y_test):
            correct = (model.forward(x_test).argmax(axis=1) == y_test).sum()
        totals = np.array([*stats, int(correct), len(y_test)], dtype=np.float64)
        mpidp.allreduce(comm, mpidp.IN_PLACE, totals, op="sum")
        save(epoch + 1, 0)
        loss_sum, train_ok, seen, fwd, bwd, exposed, steps, test_ok, test_n = totals
        per_step = 1e3 / max(steps, 1)  # seconds summed over ranks -> ms per step, rank average
        row = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1),
               "train_acc": train_ok / max(seen, 1), "test_acc": test_ok / max(test_n, 1),
               "samples_per_s": seen / elapsed, "forward_ms": fwd * per_step,
               "backward_ms": bwd * per_step, "exposed_comm_ms": exposed * per_step,
               "epoch_s": elapsed, "ranks": size, "zero": args.zero,
               "memory_bytes": model_state_bytes(ddp)["total"]}
        if peak is not None:  # absent on a GPU: tracemalloc does not see CuPy's memory
            row["peak_memory_bytes"] = peak
        if rank == 0:
            print(f"epoch {row['epoch']:3d}  loss {row['loss']:.4f}  "
                  f"train {row['train_acc']:.4f}  test {row['test_acc']:.4f}  "
                  f"{row['samples_per_s']:8.0f} samples/s  "
                  f"step ms: fwd {row['forward_ms']:.2f} bwd {row['backward_ms']:.2f} "
                  f"comm {row['exposed_comm_ms']:.2f}", flush=True)
            if metrics is not None:
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
        dog.kick()  # the epoch's evaluation, all-reduce and checkpoint are done
    if metrics is not None:
        metrics.close()
    if tracer is not None:
        tracer.write(args.trace, comm)
        dog.kick()
    ddp.close()
    if tracer is not None and rank == 0:  # the last line: where the timeline is
        print(f"trace: {args.trace} (open it in https://ui.perfetto.dev, or draw it: "
              f"python -m mpidp.trace plot {args.trace} -o timeline.png)")
    return 0


if __name__ == "__main__":
    sys.exit(watchdog.run(main, PROG))
