"""One collective on N simulated ranks, set up the way mpidp's entry points set it up.

`simulate` builds each rank's buffers as `mpidp.collectives.api` does (the same
`Blocks`, scratch size, ``src`` for out of place, where a reduce-scatter result
goes), runs the algorithm's unchanged generator on every rank with `Sim`, and
returns an `Outcome`: the results, the NumPy reference, and the counters.
Inputs are small integers in the tested dtype, so every order of reduction gives
the same bits and results are compared exactly.
"""

from __future__ import annotations

import numpy as np

from mpidp.collectives.algorithms import COLLECTIVES, REGISTRY, of  # noqa: F401 (mpidp.sim.COLLECTIVES)
from mpidp.collectives.algorithms.blocks import Blocks, one_vector
from mpidp.collectives.mpiops import resolve_op
from mpidp.collectives.plans import through_packed

from .engine import TIMEOUT, Sim, TallyOp

REDUCING = ("allreduce", "reduce_scatter")  # the collectives that take an op and scratch
SENTINEL = 77  # what a receive buffer holds before the collective: items it must overwrite
GARBAGE = 99  # what scratch holds at the start: an algorithm must not read it unwritten


def names(collective: str) -> tuple[str, ...]:
    """mpidp's algorithm names for `collective` (without "auto"): the registry's, read now."""
    return tuple(REGISTRY[collective])


def resolve(collective: str, algorithm, scratch=None, placement=None):
    """(generator, scratch items as a function of blocks or None, name) for a name or a function.

    A function that mpidp registers gets its registered scratch size, and `placement`
    handed in if it reads one; another one gets `scratch`, by default a whole vector
    (``blocks.total`` items).
    """
    if isinstance(algorithm, str):
        if algorithm not in REGISTRY[collective]:
            raise ValueError(f"unknown {collective} algorithm {algorithm!r}; "
                             f"expected one of {names(collective)}")
        found = REGISTRY[collective][algorithm]
    else:
        found = of(algorithm)
        found = found if found is not None and found.collective == collective else None
    fn = algorithm if found is None else found.bound(placement)
    name = found.name if found else getattr(algorithm, "__name__", repr(algorithm))
    if collective not in REDUCING:
        return fn, None, name
    if scratch is None:
        scratch = found.scratch if found is not None else one_vector
    return fn, scratch, name


def layout(collective: str, N: int, count: int, counts=None, displs=None) -> Blocks:
    """The blocks of a collective: `counts`/`displs` as given, or `count` items split evenly."""
    if counts is not None:
        return Blocks(counts, displs if collective == "allgather" else None)
    return Blocks.even(count, N)


def per_rank(displs, N: int) -> bool:
    """True if `displs` gives each rank a layout of its own (a list of N lists)."""
    return displs is not None and len(displs) == N and all(
        isinstance(d, (list, tuple)) for d in displs)


def make_input(op: str, dtype, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """Rank `rank`'s input: small values, exact under every order of reduction."""
    rng = np.random.default_rng([seed, rank, count])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if op == "prod":  # powers of two (and units) stay exact until they overflow, in any order
        vals = rng.choice([1, 2, 3] if dt.kind == "u" else [1, 1, -1, 2], count)
        x = vals.astype(dt)
        if dt.kind == "c":
            x = x * rng.choice([1, 1j], count)
        return x
    if op in ("land", "lor", "lxor"):
        vals = rng.integers(0, 3, count)
    elif op in ("band", "bor", "bxor"):
        vals = rng.integers(0, 128, count)
    else:
        vals = rng.integers(0 if dt.kind == "u" else -30, 30, count)
    x = vals.astype(dt)
    if dt.kind == "c":
        x = x + 1j * rng.integers(-5, 5, count)
    return x


class Outcome:
    """A simulated collective: the counters (`sim`), every rank's result and the reference."""

    def __init__(self, collective, name, N, blocks, dtype, op, in_place, root, sim, inputs,
                 results, sendbufs, expected):
        self.collective, self.name, self.N, self.blocks = collective, name, N, blocks
        self.dtype, self.op, self.in_place, self.root = dtype, op, in_place, root
        self.sim, self.inputs, self.results = sim, inputs, results
        self.sendbufs, self.expected = sendbufs, expected

    def problems(self, limit: int = 3) -> list[str]:
        """What differs from the reference, one line per rank (at most `limit` ranks)."""
        if self.expected is None:
            raise ValueError("a run with data=False computes nothing to compare")
        out = []
        for r, (got, want) in enumerate(zip(self.results, self.expected, strict=True)):
            if got.shape != want.shape or not np.array_equal(got, want):
                bad = np.flatnonzero(got != want) if got.shape == want.shape else np.arange(0)
                out.append(f"rank {r}: result differs at items {bad[:6].tolist()} of {got.size}: "
                           f"got {got[bad[:6]].tolist()}, want {want[bad[:6]].tolist()}")
        for r, (sent, x) in enumerate(zip(self.sendbufs, self.inputs, strict=True)):
            if sent is not None and not np.array_equal(sent, x):
                out.append(f"rank {r}: the input (sendbuf, read only) was written, items "
                           f"{np.flatnonzero(sent != x)[:6].tolist()}")
        return out[:limit]


def simulate(collective: str, algorithm, N: int, count: int = 0, *, counts=None, displs=None,
             dtype="float64", op="sum", in_place: bool = False, root: int = 0, inputs=None,
             seed: int = 0, scratch=None, trace: bool = False, timer=None,
             on_step=None, max_steps: int | None = None, placement=None,
             timeout: float | None = TIMEOUT, data: bool = True) -> Outcome:
    """Run `algorithm` (a name or a generator function) for `collective` on N simulated ranks.

    Args:
        count: items of the whole vector (all-gather: of all blocks together), split
            into N blocks as `Blocks.even` does; or give `counts` (and, for all-gather,
            `displs`): ``MPI_Reduce_scatter``'s recvcounts, ``MPI_Allgatherv``'s layout;
            `displs` may also be one list per rank, each rank's own layout (MPI allows
            it: only the counts must agree).
        inputs: each rank's input, of one dtype (all-reduce, reduce-scatter: the vector;
            all-gather: its block; broadcast: the root's vector); default `make_input`.
        in_place: the input is in the receive buffer (``IN_PLACE``).
        scratch: items of scratch as a function of the blocks, for a function mpidp
            does not register (default: one whole vector).
        trace, timer, on_step, max_steps, timeout: passed to `Sim`.
        data: False: count, do not compute (`Sim`'s `data`): no copies, no reductions, no
            reference; the counters are right for schedules that do not depend on the data,
            and the results mean nothing (`Outcome.problems` refuses to compare them).
        placement: the host of each rank, e.g. ``topology.layout(N, ppn=2)``; None: one host.
    Raises:
        ScheduleError: deadlock, mismatched pair or overlapping round (see `Sim`).
    """
    placement = None if placement is None else tuple(placement)
    fn, scratch_items, name = resolve(collective, algorithm, scratch, placement)
    found = of(fn)
    own = per_rank(displs, N) and collective == "allgather"
    layouts = [layout(collective, N, count, counts, displs[r] if own else displs)
               for r in range(N)]  # each rank's own blocks
    blocks = layouts[0]
    the_op = resolve_op(op)
    dt = np.dtype(dtype) if inputs is None else inputs[0].dtype
    if inputs is None:
        sizes = {"allgather": blocks.counts}.get(collective, [blocks.total] * N)
        inputs = [make_input(the_op.name, dt, sizes[r], r, seed) for r in range(N)]
    sim = Sim(N, trace=trace, timer=timer, on_step=on_step, max_steps=max_steps,
              placement=placement, timeout=timeout,
              data=data)
    gens, results, sendbufs = [], [], []
    for r, comm in enumerate(sim.comms):
        x, src, tmp = inputs[r], None, None
        if collective == "bcast":
            buf = x.copy() if r == root else np.full(x.size, SENTINEL, dt)
            gens.append(fn(comm, buf, root))
        elif collective == "allgather":
            mine = layouts[r]
            buf = np.full(mine.extent, SENTINEL, dt)
            mine.view(buf, r)[...] = x
            if mine.packed or (found is not None and found.any_layout):
                gens.append(fn(comm, buf, mine))
            else:  # as plan_allgather: on a packed copy, then to this rank's layout
                tmp = np.full(mine.total, GARBAGE, dt)
                gens.append(through_packed(fn, comm, buf, mine, tmp, mine.view(buf, r)))
        else:
            tmp = np.full(scratch_items(blocks), GARBAGE, dt)
            if in_place:
                buf = x.copy()  # all-reduce: recvbuf; reduce-scatter: the work vector
            else:
                src = x.copy()
                buf = np.full(x.size, SENTINEL if collective == "allreduce" else GARBAGE, dt)
                if N == 1:  # as the entry points do: one rank, no round writes buf
                    buf[...] = src
            if collective == "allreduce" and blocks.total == 0:
                gens.append(iter(()))  # the entry point sends nothing
            else:
                gens.append(fn(comm, buf, blocks, sim.op(the_op, r), tmp,
                               src if N > 1 else None))
        sendbufs.append(src)
        sim.where[r] = {"buf": buf, "src": src, "tmp": tmp}
        results.append(buf)
    with np.errstate(over="ignore"):  # products may overflow, alike in any order
        sim.run(gens)
        expected = reference(collective, blocks, inputs, the_op, root) if data else None
    if own and data:  # each rank's result in its own layout
        expected = [reference(collective, b, inputs, the_op, root)[r]
                    for r, b in enumerate(layouts)]
    if collective == "reduce_scatter":  # rank r's result is block r of its work vector
        results = [blocks.view(buf, r).copy() for r, buf in enumerate(results)]
    return Outcome(collective, name, N, blocks, dt, the_op, in_place, root, sim, inputs,
                   results, sendbufs, expected)


def reference(collective: str, blocks: Blocks, inputs, op, root: int = 0) -> list:
    """What every rank must hold afterwards, computed by NumPy from all the inputs."""
    N = len(inputs)
    if collective == "bcast":
        return [inputs[root]] * N
    if collective == "allgather":
        whole = np.full(blocks.extent, SENTINEL, inputs[0].dtype)
        for q, x in enumerate(inputs):
            blocks.view(whole, q)[...] = x
        return [whole] * N
    total = inputs[0].copy()
    ufunc = getattr(np, op.ufunc)
    for x in inputs[1:]:
        ufunc(total, x, out=total)
    if op.divide and N > 1:
        np.true_divide(total, N, out=total)
    if collective == "allreduce":
        return [total] * N
    return [blocks.view(total, r) for r in range(N)]


def rounds_of(collective: str, algorithm: str, comm, count, dtype="float64", op="sum",
              root: int = 0, placement=None):
    """One rank's generator of `collective` by `algorithm` on `comm` (a `SimComm`), on
    buffers of the sizes the entry point gives it and no data (`TallyOp`): for a run that
    matches messages and moves none (`sequence.run_sequences`, the doctor's replay).

    Args:
        count: as a flight record gives it (`plan.signed`): all-reduce and broadcast,
            the items; reduce-scatter and all-gather, the items of each rank's block.
        placement: the host of each rank, handed to an algorithm that reads one (None:
            one host).
    """
    fn, scratch_items, _ = resolve(collective, algorithm, placement=placement)
    dt, N = np.dtype(dtype), comm.Get_size()
    if collective == "bcast":
        return fn(comm, np.zeros(count, dt), root)
    if collective == "allgather":
        blocks = Blocks(list(count))
        return fn(comm, np.zeros(blocks.total, dt), blocks)
    blocks = Blocks(list(count)) if collective == "reduce_scatter" else Blocks.even(count, N)
    if blocks.total == 0 and collective == "allreduce":
        return iter(())  # the entry point sends nothing
    the_op = TallyOp(resolve_op(op), [0] * N, comm.Get_rank())
    return fn(comm, np.zeros(blocks.total, dt), blocks, the_op,
              np.zeros(scratch_items(blocks), dt), None)
