"""Resuming a trainer from its checkpoint: only the run it was written by, from where it stood.

A checkpoint records (`checkpoint.save`'s ``settings``) every flag that changes what a
run computes; `--resume` with any of them changed is refused, each one named, because
the bits would then differ from the run never interrupted. Going through the flags:

- recorded: the data and its order (``--seed``, ``--global-batch``, ``--accum-steps``;
  the MLP's ``--data``; the GPT's ``--corpus-mb`` and the corpus it read: its size,
  vocabulary and a CRC of its tokens, which change with the Python version), the model
  (``--hidden``/``--activation``, ``--layers``/``--heads``/``--width``/``--context``,
  ``--dtype``: the checkpoint's model entries hold them too), the optimizer and its
  hyperparameters (``--optimizer``, ``--lr``, and those of the optimizer chosen:
  ``--momentum``, ``--weight-decay``, ``--beta1``, ``--beta2``, ``--eps``), and how the
  gradient is summed (``--deterministic``, its ``--micro-batch``; ``--comm-hook`` but
  none: a checkpoint written without one records nothing, and one with PowerSGD is
  never resumed, its state not being saved);
- not recorded, free to change: how the same result is computed (the rank count,
  ``--bucket-mb``, ``--first-bucket-mb``, ``--piece-mb``, ``--algorithm``, ``--zero``,
  ``--no-overlap``, ``--progress-thread``, ``--blas-threads``, ``--device``: under
  ``--deterministic`` none changes a bit, without it they change the rounding only, as
  the rank count does), how long it runs (``--epochs``, ``--max-steps``), what it
  reports and writes (``--eval-every``, ``--eval-tokens``, ``--sample-tokens``,
  ``--metrics``, ``--trace``, ``--checkpoint-every``, ``--progress``, ``--debug``).

Then the position is checked against the data: the saved step within the epoch's steps,
the optimizer's step count equal to the steps of the epochs and step done.
"""

from __future__ import annotations

import argparse

from .. import cli
from . import checkpoint
from .checkpoint import LEGACY, CheckpointError

OPTIMIZER_SETTINGS = {"sgd": ("momentum", "weight_decay"),
                      "adam": ("beta1", "beta2", "eps", "weight_decay"),
                      "adamw": ("beta1", "beta2", "eps", "weight_decay")}


def settings(args: argparse.Namespace, **own) -> dict:
    """The settings a checkpoint records: the common flags that change the result (the
    module's docstring), and the trainer's `own` (its data and model)."""
    names = ["seed", "global_batch", "accum_steps", "optimizer", "lr", "dtype",
             "deterministic", "micro_batch", *OPTIMIZER_SETTINGS[args.optimizer]]
    hook = {} if getattr(args, "comm_hook", "none") == "none" else {"comm_hook": args.comm_hook}
    return {**{name: getattr(args, name) for name in names}, **hook, **own}


def resume(path: str, model, opt, run: dict, steps_per_epoch: int) -> tuple[int, int, str]:
    """Load `path` into the model and optimizer if it was written by a run with the settings
    `run`: the epoch and step it was saved at, and a note for an old format ("" if none)."""
    def position(saved: dict, steps: int) -> None:  # before load changes anything
        epoch, step = saved["epoch"], saved["step"]
        if step > steps_per_epoch:
            raise CheckpointError(f"{path}: state/step {step} is past the {steps_per_epoch} "
                                  "steps of an epoch")
        if steps != epoch * steps_per_epoch + step:
            raise CheckpointError(f"{path}: optim/steps {steps} does not match epoch "
                                  f"{epoch}, step {step} at {steps_per_epoch} steps per epoch")

    saved = checkpoint.load(path, model, opt, state_keys=["epoch", "step"], settings=run,
                            check=position)
    epoch, step = saved["epoch"], saved["step"]
    note = ""
    old = checkpoint.version(path)
    if old < checkpoint.FORMAT:
        unchecked = ", ".join(k for k in run if k not in LEGACY)
        note = (f"note: {path} is format {old}, which does not record {unchecked}: "
                "this run's are used unchecked")
    return epoch, step, note


def start_from(args: argparse.Namespace, comm, model, opt, problem: str | None, prog: str,
               run: dict, steps_per_epoch: int | None) -> tuple[int, int]:
    """The epoch and step training starts at: (0, 0), or with --resume the checkpoint's.

    A collective: `problem` (rank 0's check of its outputs, a bad --global-batch) or a
    checkpoint that cannot be resumed ends every rank with exit code 2 (`cli.agree`)
    before anything is trained or written.
    """
    start_epoch, start_step, note = 0, 0, ""
    if args.resume and problem is None:  # every rank reads the same file
        try:
            start_epoch, start_step, note = resume(args.checkpoint, model, opt, run,
                                                   steps_per_epoch)
        except CheckpointError as e:
            problem = str(e)
    cli.agree(comm, problem, prog)
    if note and comm.Get_rank() == 0:
        print(note, flush=True)
    return start_epoch, start_step


def nothing_to_do(args: argparse.Namespace, epoch: int, step: int, steps: int, prog: str,
                  rank: int) -> bool:
    """True (rank 0 says so in one line) if a resumed run at `epoch`, `step` (`steps`
    optimizer steps in all) has no step left under --epochs and --max-steps."""
    if epoch < args.epochs and not (args.max_steps and steps >= args.max_steps):
        return False
    if rank == 0:
        where = (f"the end of epoch {epoch}" if step == 0 else
                 f"step {step} of epoch {epoch + 1}")
        asks = f"--epochs {args.epochs}" + (f" and --max-steps {args.max_steps} ask"
                                            if args.max_steps else " asks")
        print(f"{prog}: nothing to do: {args.checkpoint} is at {where} ({steps} steps in "
              f"all), and {asks} for no more", flush=True)
    return True
