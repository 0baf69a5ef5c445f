"""Command lines that run on every rank: a mistake is one line on rank 0 and exit code 2
on every rank, never a traceback per rank, nor a rank left waiting for the others.

    p = cli.Parser(prog="train.py")
    p.add_argument("--epochs", type=cli.number(int, 1), default=12)   # >= 1
    try:
        args = p.parse_args(argv)          # the same argv on every rank: the same outcome
    except cli.UsageError as e:
        return cli.usage_error(p.prog, e)  # rank 0 prints it; every rank returns 2
    ...
    cli.agree(comm, problem, p.prog)       # a problem some ranks found: all exit 2 together
"""

from __future__ import annotations

import argparse
import math
import sys

from mpi4py import MPI

from .watchdog import ExitAll


class UsageError(Exception):
    """A bad flag, path or input file: one line on rank 0, exit code 2 on every rank."""


class Parser(argparse.ArgumentParser):
    """argparse, with an error raised as `UsageError` instead of printed, with the usage,
    by every rank, and the help printed by rank 0 alone."""

    def error(self, message: str):
        raise UsageError(message)

    def _print_message(self, message: str, file=None) -> None:
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


def number(kind: type, low: float, *, above: bool = False):
    """An argparse type: a finite `kind` (int or float) >= `low` (> `low` if `above`)."""
    def convert(text: str):
        value = kind(text)  # a ValueError here: argparse says "invalid int value"
        if not (math.isfinite(value) and (value > low if above else value >= low)):
            raise argparse.ArgumentTypeError(f"must be {'>' if above else '>='} {low:g}, "
                                             f"got {text}")
        return value
    convert.__name__ = kind.__name__
    return convert


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated integers, each >= 1 ("" for none)."""
    try:
        values = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers such as 128,64, got {text!r}") \
            from None
    if any(w < 1 for w in values):
        raise argparse.ArgumentTypeError(f"every number must be >= 1, got {text}")
    return values


def usage_error(prog: str, error: Exception) -> int:
    """Say `error` on rank 0 and return 2 (every rank found it: nobody waits for anybody)."""
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    return 2


def agree(comm, problem: str | None, prog: str) -> None:
    """A collective: if any rank found a problem, rank 0 says the first one and every
    rank raises `ExitAll(2)` (which `watchdog.run` and `watchdog.guard` let through)."""
    problems = comm.allgather(problem)
    first = next(((r, p) for r, p in enumerate(problems) if p), None)
    if first is None:
        return
    if comm.Get_rank() == 0:
        r, p = first
        print(f"{prog}: error: {p}" + (f" (on rank {r})" if r else ""), file=sys.stderr,
              flush=True)
    raise ExitAll(2)
