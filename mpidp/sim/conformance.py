"""The conformance kit: check an algorithm, yours or mpidp's, for every N in a range.

    python -m mpidp.sim check MODULE:FUNCTION --collective allreduce --ranks 1-64

runs the generator on N simulated ranks for every N in the range and every
shape of count (0, 1, fewer than N, not divisible by N, divisible, large),
every op and several dtypes, in and out of place, against NumPy; it also checks
that a sum of random floats comes out with the same bits on every rank. On a
failure it looks for the smallest failing case (fewest ranks, then fewest
items, then sum on int64) and reports it; on success it prints the volume and
rounds it measured beside the α-β-γ formulas of mpidp's own algorithms.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from typing import NamedTuple

import numpy as np

from mpidp.collectives import cost
from mpidp.collectives.algorithms import of
from mpidp.collectives.algorithms.fold import fold
from mpidp.collectives.algorithms.ops import OPS

from .collective import REDUCING, names, resolve, simulate
from .engine import TIMEOUT, ScheduleError

DTYPES = ("int32", "float64", "uint8", "float32", "complex128", "int64", "float16", "bool")
SHAPES = ("0", "1", "< N", "not divisible by N", "divisible by N", "large")


def counts_for(N: int) -> list[int]:
    """One count of each shape in SHAPES, for N ranks."""
    return [0, 1, max(N - 1, 1), 2 * N + 1, 3 * N, 16 * N + 7]


def pairs(collective: str) -> list[tuple[str, str]]:
    """(op, dtype) pairs to cycle through: every op on every dtype MPI defines it for."""
    if collective not in REDUCING:
        return [("sum", dt) for dt in DTYPES]
    return [(op, dt) for op in OPS for dt in DTYPES if np.dtype(dt).kind in OPS[op].kinds]


class Case(NamedTuple):
    N: int
    count: int
    dtype: str
    op: str
    in_place: bool
    root: int = 0

    def __str__(self) -> str:
        place = ", in place" if self.in_place else ""
        return (f"N = {self.N}, count = {self.count}, {self.dtype}, op {self.op}{place}"
                + (f", root {self.root}" if self.root else ""))


def cases(collective: str, ranks, quick: bool = False):
    """The cases for every N in `ranks`: each count shape, in and out of place, with (op,
    dtype) pairs in rotation so that all of them occur. `quick`: two shapes per N, in turn."""
    cycle, i = pairs(collective), 0
    for N in ranks:
        counts = counts_for(N)
        chosen = [counts[j % len(counts)] for j in (2 * N, 2 * N + 1)] if quick else counts
        for count in chosen:
            for in_place in (False, True) if collective in REDUCING else (False,):
                op, dtype = cycle[i % len(cycle)]
                i += 1
                root = (i * 7) % N if collective == "bcast" else 0
                yield Case(N, count, dtype, op, in_place, root)


def run_case(collective: str, algorithm, case: Case, scratch=None,
             placement=None, timeout: float | None = TIMEOUT) -> str | None:
    """What is wrong with `algorithm` in `case` (a line or a few), or None.

    `placement`: a function of N giving the host of each rank (None: one host).
    """
    try:
        out = simulate(collective, algorithm, case.N, case.count, dtype=case.dtype,
                       op=case.op, in_place=case.in_place, root=case.root, scratch=scratch,
                       placement=placement and placement(case.N),
                       max_steps=8 * case.N * case.N + 1000, timeout=timeout)
    except ScheduleError as e:
        return str(e)
    problems = out.problems()
    return "\n".join(problems) if problems else None


def same_bits(collective: str, algorithm, N: int, scratch=None, placement=None,
              timeout: float | None = TIMEOUT) -> str | None:
    """Random floats, summed: every rank must hold the same bits, close to NumPy's sum."""
    if collective != "allreduce" or N == 1:
        return None
    rng = np.random.default_rng(N)
    inputs = [rng.standard_normal(4 * N + 3) for _ in range(N)]
    try:
        out = simulate(collective, algorithm, N, 4 * N + 3, inputs=inputs, scratch=scratch,
                       placement=placement and placement(N), max_steps=8 * N * N + 1000,
                       timeout=timeout)
    except ScheduleError as e:
        return str(e)
    differ = [r for r in range(N) if not np.array_equal(out.results[r], out.results[0])]
    if differ:
        return (f"N = {N}, random float64 sum: ranks {differ[:8]} hold other bits than rank 0 "
                "(every rank must reduce in the same order, or copy one rank's result)")
    bound = N * 2.3e-16 * np.sum(np.abs(inputs), axis=0)  # N terms in any order
    if np.any(np.abs(out.results[0] - out.expected[0]) > bound):
        return f"N = {N}, random float64 sum: off by more than rounding"
    return None


class Report(NamedTuple):
    ok: bool
    cases: int
    text: str
    failure: Case | None = None


def check(algorithm, collective: str = "allreduce", ranks=range(1, 65), *, scratch=None,
          quick: bool = False, volume: bool = True, label: str | None = None,
          placement=None, timeout: float | None = TIMEOUT) -> Report:
    """Check `algorithm` (a generator function, or an mpidp name) on every N in `ranks`.

    Args:
        algorithm: takes what mpidp's algorithms for `collective` take, see
            docs/simulator.md: ``(comm, buf, blocks, op, tmp, src=None)`` for allreduce
            and reduce_scatter, ``(comm, buf, blocks)`` for allgather, ``(comm, buf,
            root)`` for bcast.
        scratch: items of `tmp` as a function of the blocks (default: a whole vector,
            or what mpidp registers for its own algorithms).
        quick: two count shapes per N instead of all six (the test suite's setting).
        volume: measure bytes and rounds and print them beside the formulas.
        placement: a function of N giving the host of each rank, e.g.
            ``lambda N: topology.layout(N, ppn=2)`` (None: one host).
        timeout: seconds one resume of the generator may run (`Sim`): a case that takes
            longer fails, as a loop that never yields.
    """
    ranks = list(ranks)
    label = label or getattr(algorithm, "__name__", str(algorithm))
    head = (f"mpidp.sim check {label} ({collective}), N = {_span(ranks)}: counts "
            f"{', '.join(SHAPES)}; {len(pairs(collective))} op/dtype pairs in turn")
    n = 0
    for case in cases(collective, ranks, quick):
        n += 1
        problem = run_case(collective, algorithm, case, scratch, placement, timeout)
        if problem is not None:
            return _failed(collective, algorithm, case, problem, n, head, scratch, ranks,
                           placement, timeout)
    for N in ranks:
        problem = same_bits(collective, algorithm, N, scratch, placement, timeout)
        if problem is not None:
            return Report(False, n, f"{head}\nFAILED: {problem}", Case(N, 4 * N + 3, "float64",
                                                                      "sum", False))
    text = f"{head}\nok: {n} cases passed"
    if volume:
        text += "\n\n" + measured(collective, algorithm, ranks, scratch, placement)
    return Report(True, n, text)


def _failed(collective, algorithm, case, problem, n, head, scratch, ranks,
            placement=None, timeout=TIMEOUT) -> Report:
    small, small_problem = shrink(collective, algorithm, case, problem, scratch, ranks,
                                  placement, timeout)
    fn = resolve(collective, algorithm)[0]
    call = (f"mpidp.sim.simulate({collective!r}, {fn.__module__}.{fn.__name__}, {small.N}, "
            f"{small.count}, dtype={small.dtype!r}, op={small.op!r}, in_place={small.in_place}"
            f"{f', root={small.root}' if small.root else ''}).problems()")
    text = (f"{head}\nFAILED after {n} cases, first at {case}:\n{_indent(problem)}\n"
            f"smallest failing case: {small}\n{_indent(small_problem)}\nreproduce: {call}")
    return Report(False, n, text, small)


def shrink(collective: str, algorithm, case: Case, problem: str, scratch=None, ranks=None,
           placement=None, timeout: float | None = TIMEOUT):
    """The smallest case that still fails: fewest ranks (of `ranks`), then fewest items, then
    sum on int64."""
    for N in sorted(n for n in ranks or range(1, case.N + 1) if n <= case.N):
        for count in sorted({*range(min(case.count, 2 * N + 2) + 1), *counts_for(N)}):
            if count > case.count:
                break
            for simple in (Case(N, count, "int64", "sum", False),
                           case._replace(N=N, count=count, root=case.root % N)):
                found = run_case(collective, algorithm, simple, scratch, placement, timeout)
                if found is not None:
                    return simple, found
    return case, problem


def measured(collective: str, algorithm, ranks, scratch=None, placement=None) -> str:
    """Bytes and rounds measured per rank beside the formulas of mpidp's algorithms."""
    formulas = list(names(collective))
    lines = ["measured: steps (the critical path in rounds), and per rank the most rounds, bytes "
             "sent, received and reduced over the ranks (multiples of G, the vector's bytes);",
             "beside the cost model's terms for mpidp's algorithms (cost.py): rounds / bytes / "
             "reduced bytes on the critical path",
             "   N | steps | rounds |  sent |  recv | reduced | " + " | ".join(formulas)]
    for N in sorted({N for N in (2, 3, 4, 8, 16, 64) if N in ranks} or {max(ranks)}):
        q = fold(N)[0]  # the largest power of two <= N
        count = 2 * N * q // math.gcd(N, q)  # whole blocks for N and for q, and halves
        out = simulate(collective, algorithm, N, count, dtype="int64", scratch=scratch,
                       placement=placement and placement(N))
        s, G = out.sim, count * 8.0
        cells = []
        for name in formulas:
            _, rounds, sent, reduced = cost.terms(collective, name, G, N)
            cells.append(f"{rounds:.0f} / {sent / G:.3f} / {reduced / G:.3f}")
        lines.append(f"{N:>4} | {s.steps:>5} | {max(s.rounds):>6} | {max(s.bytes_sent) / G:.3f}"
                     f" | {max(s.bytes_received) / G:.3f} | {max(s.reduced) / count:>7.3f} | "
                     + " | ".join(cells))
    return "\n".join(lines)


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else \
        ",".join(map(str, ranks))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def load(spec: str, scratch: bool = False):
    """The generator of rounds named by 'MODULE:FUNCTION' (the module imported from sys.path
    or the cwd), or with `scratch` the Python function of a scratch size.

    Nothing else is ever called: a function that does not yield (``os:getcwd``) is a
    ValueError saying so, as is a module that raises while it is imported (ImportError).
    """
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"expected MODULE:FUNCTION, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise
    except Exception as e:  # the module's own code failed: one line, not its traceback
        raise ImportError(f"importing {module} raised {type(e).__name__}: {e}") from None
    if scratch and not inspect.isfunction(found):
        raise ValueError(f"{spec!r} is not a Python function (blocks -> scratch items)")
    if not scratch and not (inspect.isgeneratorfunction(found) or of(found)):
        raise ValueError(f"{spec!r} is not a generator of rounds (a function that yields "
                         "lists of Send and Recv) nor a registered algorithm")
    return found
