"""Train an MLP on handwritten digits with data parallelism over MPI ranks.

    mpiexec -n 4 python examples/train_mlp.py
    mpiexec -n 4 python examples/train_mlp.py --hidden 256,128 --no-overlap --trace run.json
    mpiexec -n 2 python examples/train_mlp.py --checkpoint ck.npz --epochs 5
    mpiexec -n 4 python examples/train_mlp.py --checkpoint ck.npz --epochs 10 --resume
    mpiexec -n 4 python examples/train_mlp.py --zero 2 --optimizer adam   # ZeRO stage 2
    mpiexec -n 4 python examples/train_mlp.py --zero 3 --optimizer adam   # parameters too
    mpiexec -n 3 python examples/train_mlp.py --deterministic   # the bits of 1 rank

The global batch is split over the ranks (and over --accum-steps micro-batches
on each), so the same --global-batch and --seed give the same training whatever
the number of ranks: to rounding by default, bitwise with --deterministic (the
global batch cut into micro-shards of --micro-batch samples, summed exactly).
Rank 0 prints one line per epoch and writes --metrics.

A bad flag or MPIDP_* variable, an output path rank 0 cannot write (or two of
--metrics, --trace, --checkpoint naming one file: mpidp.training.outputs), an
existing --checkpoint without --resume or --overwrite, or a checkpoint that
cannot be resumed: rank 0 says so in one line and every rank exits with code 2,
before any training (--resume with no epoch left to train: one line, exit 0).
After that, an exception on any rank ends the whole job, and so does a stretch
with no progress longer than the deadline (MPIDP_TIMEOUT seconds, or by default
max(60 s, 10 x the longest seen), see mpidp.watchdog.guard).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from functools import partial

import numpy as np

import mpidp
from mpidp import cli, watchdog
from mpidp.trace import Tracer
from mpidp.training import MLP, data, outputs, resume, stepflags, trainer
from mpidp.training.memory import StepPeak, model_state_bytes
from mpidp.training.mlp import device_module, softmax_cross_entropy

PROG = "train_mlp.py"


DEFAULT_LR = {"sgd": 0.05, "adam": 1e-3, "adamw": 1e-3}


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, each checked here: a bad one is a `cli.UsageError`, the same on every rank."""
    p = trainer.parser(PROG, __doc__.split("\n")[0], DEFAULT_LR, epochs=12, global_batch=64,
                       metrics_help="JSON lines, one object per epoch")
    p.add_argument("--hidden", type=cli.counts, default="128,64",
                   help="hidden widths, e.g. 128,64")
    p.add_argument("--activation", default="relu", choices=["relu", "tanh"],
                   help="between the layers")
    p.add_argument("--data", default="digits", choices=["digits", "synthetic"],
                   help="scikit-learn's 8x8 digits, or Gaussian inputs of a linear teacher")
    return trainer.checked(p, argv)


def train(args: argparse.Namespace, comm, dog: watchdog.Dog) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    problem = trainer.problems(args, rank)
    xp = device_module(args.device)
    ds = data.digits(seed=args.seed) if args.data == "digits" else data.synthetic(seed=args.seed)
    trainer.blas_threads(args.blas_threads)  # again: scikit-learn has loaded a BLAS of its own
    dtype = np.dtype(args.dtype)
    x_train, y_train = xp.asarray(ds.x_train.astype(dtype)), xp.asarray(ds.y_train)
    x_test, y_test = ds.x_test[rank::size].astype(dtype), ds.y_test[rank::size]  # my test shard
    x_test, y_test = xp.asarray(x_test), xp.asarray(y_test)
    sampler = None
    try:  # A micro-batches per rank and step (--deterministic: its micro-shards)
        A = trainer.micro_batches(args, size)
        sampler = stepflags.sampler(args, len(ds.y_train), rank, size, A)
    except ValueError as e:
        problem = problem or f"--global-batch: {e}"
    sizes = [ds.features, *args.hidden, ds.classes]
    model = MLP(sizes, args.activation, dtype, seed=args.seed, device=args.device)
    opt = trainer.make_optimizer(args, model)
    run = resume.settings(args, data=args.data, hidden=args.hidden,
                          activation=args.activation, **stepflags.settings(args, size))
    start_epoch, start_step = resume.start_from(args, comm, model, opt, problem, PROG, run,
                                                sampler and sampler.steps_per_epoch)
    if start_step == sampler.steps_per_epoch:  # saved after an epoch's last step, before
        start_epoch, start_step = start_epoch + 1, 0  # its row: no step of it is left
    if args.resume and resume.nothing_to_do(args, start_epoch, start_step, opt.steps, PROG,
                                            rank):
        return 0  # every rank read the same checkpoint: all return here
    tracer = Tracer(rank) if args.trace else None
    P = model.num_params()  # counted before --zero 3 leaves only this rank's shard
    ddp = trainer.data_parallel(args, model, comm, opt, tracer)
    opt = ddp.optimizer  # with --zero, this rank's shard's (the full one above is dropped)
    K = A if args.deterministic and ddp.reducer.splits_shards else 1  # shards side by side
    if rank == 0:
        print(f"mpidp: {size} rank(s), MLP {sizes} ({P} params, {args.dtype}), "
              f"{args.optimizer} lr {args.lr}, zero={args.zero}, "
              f"{len(ddp.buckets)} bucket(s), overlap={not args.no_overlap}, "
              f"algorithm={args.algorithm}, global batch {args.global_batch} = {size} x "
              f"{A} x {sampler.local_batch}, {sampler.steps_per_epoch} steps/epoch"
              + (", deterministic" if args.deterministic else ""))
        if start_epoch or start_step:
            print(f"resumed from {args.checkpoint} at epoch {start_epoch}, step {start_step}")
    metrics = outputs.Metrics(args.metrics, rank, args.resume)
    comm.Barrier()
    dog.kick()  # set up: the broadcast of the weights and auto's calibration are done
    if tracer is not None:
        tracer.reset_clock()

    save = trainer.Saver(args, ddp, opt, rank, run)

    stop = False
    for epoch in range(start_epoch, args.epochs):
        batches = sampler.epoch(epoch)  # steps x A micro-batches of b sample indices
        first = start_step if epoch == start_epoch else 0
        before = opt.steps - first  # the optimizer's steps before this epoch
        # loss sum, correct, samples, forward s, backward s, exposed comm s, steps
        stats = np.zeros(7)
        bar = trainer.Progress(args.progress if rank == 0 else "never",
                               sampler.steps_per_epoch, f"epoch {epoch + 1}",
                               args.progress_every)
        t_epoch = time.perf_counter()
        peak = {}  # "bytes" at the epoch's last step: model states + what it allocates

        def train_step(micro, stats=stats) -> None:
            """This rank's A micro-batches (forward, backward) of one step; --deterministic:
            its A micro-shards side by side, one forward and backward (ZeRO 2, 3: one each,
            their buckets made by backward), the same bits."""
            micro = [np.concatenate(micro)] if K > 1 else micro
            for a, idx in enumerate(micro):
                idx = xp.asarray(idx)
                x, y = x_train[idx], y_train[idx]  # (K*b, D), (K*b,)
                with ddp.no_sync() if a < len(micro) - 1 else nullcontext():
                    t0 = time.perf_counter()
                    logits = ddp.forward(x, micro_shards=K)  # (K*b, C)
                    t1 = time.perf_counter()
                    loss, dlogits = softmax_cross_entropy(logits, y, K)
                    if A > 1 and not args.deterministic:  # (deterministic: DataParallel's)
                        dlogits /= A  # the mean over A micro-batches of b = mean over A*b
                    ddp.backward(dlogits)
                stats[:6] += (loss * len(y), int((logits.argmax(axis=1) == y).sum()), len(y),
                              t1 - t0, ddp.timings["backward"], ddp.timings["exposed_comm"])

        def finish_step(epoch=epoch, before=before, bar=bar, peak=peak) -> None:
            """What follows a synced backward, on every rank (--uneven: joined ones too)."""
            t2 = time.perf_counter()
            stepflags.clip(args, ddp)
            ddp.step()
            if "measured" in peak:
                peak["bytes"] = peak.pop("held") + peak.pop("measured").stop()
            peak["stop"] = trainer.end_step(args, ddp, dog, tracer, t2,
                                            partial(save, epoch, opt.steps - before))
            bar.update(opt.steps - before)

        with stepflags.joined(args, ddp, finish_step):
            for step in range(first, len(batches)):
                if step == len(batches) - 1 and args.device == "cpu":
                    peak["held"] = model_state_bytes(ddp)["total"] + ddp.parts_bytes
                    peak["measured"] = StepPeak().start()  # tracemalloc: host arrays
                train_step(batches[step])
                stats[6] += 1
                finish_step()
                if peak["stop"]:
                    break
        bar.close()
        stop = peak.get("stop", False)
        if stop:
            break
        elapsed = time.perf_counter() - t_epoch
        correct = xp.asarray(0)
        with ddp.gathered():  # --zero 3: every parameter whole for a moment (collective)
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
        if "bytes" in peak:  # absent on a GPU: tracemalloc does not see CuPy's memory
            row["peak_memory_bytes"] = peak["bytes"]
        if rank == 0:
            print(f"epoch {row['epoch']:3d}  loss {row['loss']:.4f}  "
                  f"train {row['train_acc']:.4f}  test {row['test_acc']:.4f}  "
                  f"{row['samples_per_s']:8.0f} samples/s  "
                  f"step ms: fwd {row['forward_ms']:.2f} bwd {row['backward_ms']:.2f} "
                  f"comm {row['exposed_comm_ms']:.2f}", flush=True)
            metrics.write(row)
        dog.kick()  # the epoch's evaluation, all-reduce and checkpoint are done
    trainer.finish(args, ddp, tracer, comm, dog, rank)
    return 0


main = trainer.main(PROG, parse_args, train)

if __name__ == "__main__":
    sys.exit(watchdog.run(main, PROG))
