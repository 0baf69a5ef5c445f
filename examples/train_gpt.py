"""Train a small GPT on Python's own standard library source, data-parallel over MPI ranks.

    mpiexec -n 2 python examples/train_gpt.py --max-steps 40 --metrics m.jsonl
    mpiexec -n 4 python examples/train_gpt.py --layers 4 --width 128 --context 128
    mpiexec -n 3 python examples/train_gpt.py --dtype float64 --max-steps 5 --global-batch 12 \\
        --checkpoint ck.npz --overwrite
    mpiexec -n 2 python examples/train_gpt.py --zero 2 --trace gpt.json

The corpus is byte-level text: the first --corpus-mb of the standard library's
``.py`` files in sorted order (`mpidp.training.data.stdlib_text`), its tail held
out; every machine with Python has it. A sample is --context tokens, a global
batch --global-batch samples split over the ranks (and --accum-steps
micro-batches on each), so the same flags and --seed train the same model
whatever the number of ranks. Rank 0 prints one line per evaluation (before the
first step, every --eval-every steps, after the last) and writes it to --metrics
as JSON: step, loss (train, the mean over the steps since the last row), val_loss
(held-out, nats per token), tokens_per_s (trained tokens over the steps' wall
time since the last row; 0 before the first step), memory_bytes (this rank's
parameters, gradients and optimizer state), optimizer_state_bytes (the last alone: 0
in the row before the first step, the optimizer allocating its state at that step).
At the end it prints a sample.

Flags, paths, checkpoints, deadlines and exit codes behave as train_mlp.py's
(the common part is `mpidp.training.trainer`).
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
from mpidp.training import GPT, data, outputs, resume, stepflags, trainer
from mpidp.training.gpt import token_cross_entropy
from mpidp.training.memory import model_state_bytes

PROG = "train_gpt.py"
DEFAULT_LR = {"sgd": 0.3, "adam": 3e-3, "adamw": 3e-3}
MiB = 1 << 20
CORPUS_MB = (1 / 1024, 1024.0)  # 1 KiB to 1 GiB (the standard library holds some 30 MiB)


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, each checked here: a bad one is a `cli.UsageError`, the same on every rank."""
    count, positive = cli.number(int, 1), cli.number(float, 0, above=True)
    p = trainer.parser(PROG, __doc__.split("\n")[0], DEFAULT_LR, epochs=1, global_batch=24,
                       optimizer="adamw", bucket_mb=0.1,
                       metrics_help="JSON lines, one object per evaluation")
    p.add_argument("--layers", type=count, default=2, help="transformer blocks")
    p.add_argument("--heads", type=count, default=4, help="attention heads per block")
    p.add_argument("--width", type=count, default=64, help="channels, a multiple of --heads")
    p.add_argument("--context", type=count, default=64, help="tokens per sample")
    p.add_argument("--corpus-mb", type=positive, default=2.0,
                   help="MiB of standard-library source to read")
    p.add_argument("--eval-every", type=count, default=100, metavar="STEPS",
                   help="evaluate, print and write a row every STEPS steps")
    p.add_argument("--eval-tokens", type=count, default=16384,
                   help="held-out tokens per evaluation (whole samples)")
    p.add_argument("--sample-tokens", type=cli.number(int, 0), default=200,
                   help="tokens to generate at the end (0: none)")
    args = trainer.checked(p, argv)
    if not CORPUS_MB[0] <= args.corpus_mb <= CORPUS_MB[1]:
        p.error(f"--corpus-mb {args.corpus_mb:g}: from {CORPUS_MB[0]:g} (1 KiB) to "
                f"{CORPUS_MB[1]:g} MiB")
    if args.width % args.heads:
        p.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    return args


def evaluate(model, tokens, seqs, context: int, comm, chunk: int = 32) -> float:
    """Mean loss per token over every rank's `seqs` of `tokens` (collective: a sum)."""
    total = np.zeros(2)  # loss summed over tokens, tokens
    for k in range(0, len(seqs), chunk):
        x, y = data.batch(tokens, seqs[k:k + chunk], context)
        loss, _ = token_cross_entropy(model.forward(model.xp.asarray(x)), model.xp.asarray(y))
        model.cache = None
        total += (loss * y.size, y.size)
    mpidp.allreduce(comm, mpidp.IN_PLACE, total, op="sum")
    return float(total[0] / max(total[1], 1))


def train(args: argparse.Namespace, comm, dog: watchdog.Dog) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    problem = trainer.problems(args, rank)
    text = data.stdlib_text(int(args.corpus_mb * MiB))
    T, A = args.context, args.accum_steps
    n_train = data.sequences(text.train, T)
    n_val = min(data.sequences(text.val, T), args.eval_tokens // T or 1)
    val_seqs = np.arange(rank, n_val, size)  # my share of the held-out samples
    if n_val == 0:  # no held-out sequence: every val_loss would read 0.0
        problem = problem or (f"--corpus-mb {args.corpus_mb:g}: its held-out tail of "
                              f"{len(text.val)} tokens holds no sample of --context {T} "
                              "tokens (and its target): use a larger --corpus-mb or a smaller "
                              "--context")
    sampler = None
    try:  # A micro-batches per rank and step (--deterministic: its micro-shards)
        A = trainer.micro_batches(args, size)
        sampler = stepflags.sampler(args, n_train, rank, size, A)
    except ValueError as e:
        problem = problem or f"--global-batch: {e}"
    model = GPT(len(text.vocab), T, args.layers, args.heads, args.width, args.dtype,
                seed=args.seed, device=args.device)
    opt = trainer.make_optimizer(args, model)
    run = resume.settings(args, corpus_mb=args.corpus_mb, corpus=text.fingerprint(),
                          context=T, layers=args.layers, heads=args.heads, width=args.width,
                          **stepflags.settings(args, size))
    start_epoch, start_step = resume.start_from(args, comm, model, opt, problem, PROG, run,
                                                sampler and sampler.steps_per_epoch)
    if start_step == sampler.steps_per_epoch:  # saved after an epoch's last step
        start_epoch, start_step = start_epoch + 1, 0
    if args.resume and resume.nothing_to_do(args, start_epoch, start_step, opt.steps, PROG,
                                            rank):
        return 0  # every rank read the same checkpoint: all return here
    tracer = Tracer(rank) if args.trace else None
    P = model.num_params()  # counted before --zero 3 leaves only this rank's shard
    ddp = trainer.data_parallel(args, model, comm, opt, tracer)
    opt = ddp.optimizer  # with --zero, this rank's shard's
    K = A if args.deterministic and ddp.reducer.splits_shards else 1  # shards side by side
    entropy = text.unigram_entropy()
    if rank == 0:
        print(f"mpidp: {size} rank(s), GPT {args.layers} layers x {args.heads} heads x "
              f"{args.width} wide, context {T}, vocab {len(text.vocab)} bytes "
              f"({P} params, {args.dtype}), {args.optimizer} lr {args.lr}, "
              f"zero={args.zero}, {len(ddp.buckets)} bucket(s), "
              f"overlap={not args.no_overlap}, global batch {args.global_batch} = {size} x "
              f"{A} x {sampler.local_batch} samples of {T} tokens"
              + (", deterministic" if args.deterministic else ""))
        print(f"corpus: {len(text.train) + len(text.val)} bytes of {text.files} stdlib files, "
              f"{len(text.train)} train / {len(text.val)} held out ({n_val * T} evaluated); "
              f"unigram entropy {entropy:.4f} nats/token", flush=True)
        if start_epoch or start_step:
            print(f"resumed from {args.checkpoint} at epoch {start_epoch}, step {start_step}")
    metrics = outputs.Metrics(args.metrics, rank, args.resume)
    comm.Barrier()
    dog.kick()  # set up: the broadcast of the weights and auto's calibration are done
    if tracer is not None:
        tracer.reset_clock()
    save = trainer.Saver(args, ddp, opt, rank, run)
    since = {"loss": 0.0, "steps": 0, "seconds": 0.0}  # since the last row

    def report(epoch: int) -> None:
        with ddp.gathered():  # --zero 3: every parameter whole for a moment (collective)
            val = evaluate(model, text.val, val_seqs, T, comm)
        train_loss = np.array([since["loss"], since["steps"]])
        mpidp.allreduce(comm, mpidp.IN_PLACE, train_loss, op="sum")
        tokens = train_loss[1] * (args.global_batch // size) * T  # every rank's steps
        memory = model_state_bytes(ddp)  # step 0: no optimizer state yet (its first step makes it)
        row = {"step": opt.steps, "epoch": epoch, "loss": train_loss[0] / max(train_loss[1], 1),
               "val_loss": val, "tokens_per_s": tokens / since["seconds"] if tokens else 0.0,
               "memory_bytes": memory["total"], "optimizer_state_bytes": memory["optimizer"],
               "ranks": size,
               "zero": args.zero, "unigram_entropy": entropy}
        if train_loss[1] == 0:  # no rank trained since (--uneven: not only this one)
            row["loss"] = first_loss(epoch)
        if rank == 0:
            print(f"step {row['step']:5d}  loss {row['loss']:.4f}  val {val:.4f} nats/token "
                  f"(unigram {entropy:.4f})  {row['tokens_per_s']:8.0f} tokens/s", flush=True)
            metrics.write(row)
        since.update(loss=0.0, steps=0, seconds=0.0)
        dog.kick()

    def first_loss(epoch: int) -> float:
        """Before any step: the loss on the first step's samples, forward only (collective)."""
        steps = sampler.epoch(epoch)  # --uneven: this rank may have no step start_step
        seqs = np.concatenate(steps[start_step]) if start_step < len(steps) else np.empty(0, int)
        with ddp.gathered():
            return evaluate(model, text.train, seqs, T, comm)

    report(start_epoch)
    stop, last_reported = False, opt.steps
    for epoch in range(start_epoch, args.epochs):
        batches = sampler.epoch(epoch)  # steps x A micro-batches of b sample numbers
        first = start_step if epoch == start_epoch else 0
        before = opt.steps - first  # the optimizer's steps before this epoch
        bar = trainer.Progress(args.progress if rank == 0 else "never",
                               sampler.steps_per_epoch, f"epoch {epoch + 1}",
                               args.progress_every)
        state = {"stop": False, "reported": last_reported, "done": time.perf_counter()}

        def finish_step(t0=None, epoch=epoch, before=before, bar=bar, state=state) -> None:
            """What follows a synced backward, on every rank (--uneven: joined ones too,
            without `t0`, when the rank's step began: they trained on no samples)."""
            t1 = time.perf_counter()
            stepflags.clip(args, ddp)
            ddp.step()
            since["seconds"] += time.perf_counter() - (state["done"] if t0 is None else t0)
            since["steps"] += t0 is not None
            state["stop"] = trainer.end_step(args, ddp, dog, tracer, t1,
                                             partial(save, epoch, opt.steps - before))
            if state["stop"] or opt.steps % args.eval_every == 0:
                bar.clear()  # the row on a line of its own, not on the bar's
                report(epoch)  # (collective)
                state["reported"] = opt.steps
            bar.update(opt.steps - before)
            state["done"] = time.perf_counter()  # a joined rank's next step begins

        with stepflags.joined(args, ddp, finish_step):
            for step in range(first, len(batches)):
                t0 = time.perf_counter()
                # --deterministic: the A micro-shards side by side, one forward and backward
                # (ZeRO 2, 3: one each, their buckets made by backward); the same bits
                micro = [np.concatenate(batches[step])] if K > 1 else batches[step]
                for a, seqs in enumerate(micro):
                    x, y = data.batch(text.train, seqs, T)  # (K*b, T) each
                    with ddp.no_sync() if a < len(micro) - 1 else nullcontext():
                        logits = ddp.forward(model.xp.asarray(x), micro_shards=K)  # (Kb, T, V)
                        loss, dlogits = token_cross_entropy(logits, model.xp.asarray(y), K)
                        if A > 1 and not args.deterministic:  # (deterministic: DataParallel's)
                            dlogits /= A  # the mean over A micro-batches of b = over A*b
                        ddp.backward(dlogits)
                    since["loss"] += loss / len(micro)
                finish_step(t0)
                if state["stop"]:
                    break
        bar.close()
        stop, last_reported = state["stop"], state["reported"]
        if stop:
            break
        save(epoch + 1, 0)
    if last_reported != opt.steps:
        report(epoch)
    with ddp.gathered():  # collective: every rank joins, rank 0 samples
        if rank == 0 and args.sample_tokens:
            prompt = list(b"def ")
            ids = [text.vocab.index(c) for c in prompt if c in text.vocab]
            out = model.generate(np.array([ids]), args.sample_tokens,
                                 np.random.default_rng(args.seed), temperature=0.8)
            print("sample:\n" + text.decode(out[0]), flush=True)
    trainer.finish(args, ddp, tracer, comm, dog, rank)
    return 0


main = trainer.main(PROG, parse_args, train)

if __name__ == "__main__":
    sys.exit(watchdog.run(main, PROG))
