"""The α-β-γ cost model: calibrate it, predict each algorithm's time, pick the cheapest.

A round of messages costs α (latency: the MPI call, the Python round trip, the
wait for the peers) plus β per byte on the busiest link, and a reduction γ per
reduced byte; a call costs a fixed amount on top, alike for every algorithm:

    time ≈ fixed + rounds·α + bytes·β + reduced bytes·γ

The rounds, bytes and reduced bytes of each algorithm for G bytes on N ranks are
its ``cost(N, G, hosts)``, written beside it (the registry, `algorithms.REGISTRY`),
and the cost line of its module's docstring says the same (tests/test_registry.py
checks that they agree); `predict` prices them.

Small messages want few rounds (recursive doubling, binomial), large ones few
bytes (ring, Rabenseifner, scatter + all-gather).

Calibration (`calibrate`) is collective: every rank runs mpidp's own ring and
recursive-doubling all-reduce (in place, float32 sum) at 8 B, 64 KiB, 256 KiB
and 1 MiB, through the schedule driver with the comm's own point-to-point calls,
each timed as the fastest of three batches. The two algorithms differ in rounds,
bytes and reductions, so between them they separate the terms: a non-negative
least-squares fit of (fixed, α, β, γ) to the slowest rank's times, in relative
error. Timing the real schedules, not one exchange between two ranks, is what
makes α what a round costs inside a collective: the Python driver, and the wait
for the slowest of N ranks (on an oversubscribed node, several times a
back-to-back ping-pong). The ranks then agree on the numbers with a tiny
all-reduce, so every rank holds the same model and `best` makes the same choice on
every rank: a rank that chose differently from the others would deadlock. It
takes tens of milliseconds, never runs on import, and is kept in the
communicator's state (`state`: a duplicate calibrates again unless it inherits
the model, as `DataParallel`'s does).
``MPIDP_COST=default`` or ``MPIDP_COST=alpha,beta,gamma[,fixed[,beta_inter]]`` in
the environment, or `set_model`, skip it.

Across hosts (the placement, `placement`, spans several) an all-reduce's time adds
the bytes through the busiest host link at beta_inter (`link_bytes`, the ``link``
of its cost: the ring 1.5G for 2 hosts × 2 ranks, Rabenseifner nearest first and
hierarchical G, the article's order 2G); `calibrate_link` measures beta_inter. On
one host, or with beta_inter 0, nothing is added: the choice is what it was.
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, section 3.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from .. import config
from . import placement
from .algorithms import entry
from .algorithms.blocks import Blocks
from .algorithms.doubling import recursive_doubling_allreduce
from .algorithms.hosts import spans_hosts
from .algorithms.ops import MAX, SUM
from .algorithms.rounds import Rounds
from .checks import check_algorithm
from .engine.driver import run
from .linkrate import calibrate_link
from .state import state


class Model(NamedTuple):
    """Seconds per round (alpha), per byte sent (beta), per byte reduced (gamma), per call;
    and per byte through a host's link (beta_inter; 0: unknown, or one host)."""

    alpha: float
    beta: float
    gamma: float
    fixed: float = 0.0  # the same for every algorithm: it never changes the choice
    beta_inter: float = 0.0


# A shared-memory node running mpidp from Python: about 15 µs a round, 2 GB/s, 1 GB/s.
DEFAULT = Model(alpha=15e-6, beta=0.5e-9, gamma=1e-9)

# What the calibration times: ring and recursive doubling differ in rounds, bytes
# and reductions, so between them they separate α, β and γ.
PROBE_ALGORITHMS = {name: entry("allreduce", name).rounds
                    for name in ("ring", "recursive_doubling")}
SIZES = (8, 1 << 16, 1 << 18, 1 << 20)  # bytes of the whole vector
PROBES = tuple((name, size) for size in SIZES for name in PROBE_ALGORITHMS)
REPS = (10, 3)  # calls per timed batch: small vectors, from 64 KiB up


def predict(m: Model, collective: str, algorithm: str, nbytes: int, p: int,
            hosts: tuple | None = None) -> float:
    """Predicted seconds of `algorithm` for `collective` on `nbytes` (whole vector) and p ranks.

    `hosts`: the placement (`placement`); an all-reduce across hosts adds the bytes through
    the busiest host link at ``m.beta_inter`` (`link_bytes`). None, one host or
    beta_inter 0: the one-level terms alone.
    """
    if p == 1:
        return 0.0
    c = entry(collective, algorithm).cost(p, float(nbytes), hosts)
    seconds = m.fixed + c.rounds * m.alpha + c.sent * m.beta + c.reduced * m.gamma
    if m.beta_inter and c.link is not None and spans_hosts(hosts):
        seconds += c.link * m.beta_inter
    return seconds


def link_bytes(algorithm: str, hosts, G: float) -> float:
    """Bytes through the busiest host link, in its busier direction, for an all-reduce of
    G bytes (the algorithms' ideal block sizes; 0 on one host)."""
    if not spans_hosts(hosts) or len(hosts) < 2:
        return 0.0
    return entry("allreduce", algorithm).cost(len(hosts), G, tuple(hosts)).link


def best(m: Model, collective: str, names: tuple, nbytes: int, p: int,
         hosts: tuple | None = None) -> str:
    """The name in `names` with the smallest predicted time (ties: the first listed)."""
    return min(names, key=lambda name: predict(m, collective, name, nbytes, p, hosts))


# ------------------------------------------------------------ the per-comm model

def choose(comm, collective: str, nbytes: int, algorithm: str) -> str:
    """Resolve ``"auto"`` to an algorithm name; check a given name (`checks.check_algorithm`).

    ``"auto"`` takes the algorithm with the least predicted time (`best`). The
    choice depends only on (nbytes, N) and the comm's model, which every rank holds
    alike, so every rank makes it alike; the first ``"auto"`` on a comm calibrates
    the model, collectively (see `model`). The model and the answers live in the
    comm's state (`state.state`): a small collective pays for this before its
    first message, so a repeated question costs one dict lookup.
    """
    names = check_algorithm(collective, algorithm)
    if algorithm != "auto":
        return algorithm
    if comm.Get_size() == 1:
        return names[0]
    st = state(comm)
    question = (collective, nbytes)
    name = st.choices.get(question)
    if name is None:
        hosts = placement.placement(comm)  # learned once, where every rank comes in order
        m = model(comm)
        name = st.choices.remember(question, best(m, collective, names[:-1], nbytes,
                                                  comm.Get_size(),
                                                  hosts if spans_hosts(hosts) else None))
    return name


def set_model(comm, alpha: float, beta: float, gamma: float, fixed: float = 0.0,
              beta_inter: float = 0.0) -> Model:
    """Use this model for `comm` from now on. Call it on every rank with the same numbers
    (finite and >= 0, as ``MPIDP_COST`` takes them: ValueError naming the field)."""
    m = Model(float(alpha), float(beta), float(gamma), float(fixed), float(beta_inter))
    for name, value in ((k, v) for k, v in m._asdict().items() if not 0 <= v < math.inf):
        raise ValueError(f"cost model {name}={value}: expected a finite number >= 0")
    state(comm).forget(m)  # the old model's choices are stale
    return m


def model(comm) -> Model:
    """The comm's model: known, or from ``MPIDP_COST``, or calibrated now (collective)."""
    m = state(comm).model
    if m is None:
        env = config.get("MPIDP_COST")  # None, "default" or 3 to 5 numbers
        if env == "default":
            m = DEFAULT
        elif env:
            m = Model(*env)
        else:
            m = calibrate(comm)
            hosts = placement.placement(comm)
            if spans_hosts(hosts):  # one host: nothing changes
                m = m._replace(beta_inter=calibrate_link(comm, hosts))
        m = set_model(comm, *m)
        state(comm).measured = not env
    return m


def _probe_rounds(comm, name: str, buf, tmp, reps: int) -> Rounds:
    """`reps` in-place sum all-reduces of `buf` with the algorithm `name`, back to back."""
    blocks = Blocks.even(buf.size, comm.Get_size())
    for _ in range(reps):
        yield from PROBE_ALGORITHMS[name](comm, buf, blocks, SUM, tmp)


def _fastest(comm, tag: int, name: str, buf, tmp) -> float:
    """Seconds per call on this rank: the fastest of 3 batches (other processes only add time)."""
    run(comm, _probe_rounds(comm, name, buf, tmp, 1), tag)  # warm up
    reps = REPS[-1] if buf.nbytes >= 1 << 16 else REPS[0]
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        run(comm, _probe_rounds(comm, name, buf, tmp, reps), tag)
        samples.append((time.perf_counter() - t0) / reps)
    return min(samples)


def terms(collective: str, algorithm: str, nbytes: int, p: int) -> np.ndarray:
    """(1, rounds, bytes, reduced bytes) of one call: the model's time is their dot product
    with (fixed, α, β, γ)."""
    if p == 1:
        return np.array([1.0, 0.0, 0.0, 0.0])
    c = entry(collective, algorithm).cost(p, float(nbytes))
    return np.array([1.0, c.rounds, c.sent, c.reduced])


def fit(rows: np.ndarray, seconds: np.ndarray) -> Model:
    """(fixed, α, β, γ) >= 0 with the least squared relative error over the probes.

    Non-negative least squares by enumeration: with four unknowns, every subset of
    them that may be non-zero is tried, and the best fit without a negative one wins.
    """
    a, b = rows / seconds[:, None], np.ones_like(seconds)  # relative error: divide by the time
    found, least = np.zeros(4), np.inf
    for mask in range(1, 16):
        cols = [i for i in range(4) if mask >> i & 1]
        x = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (x < 0).any():
            continue
        full = np.zeros(4)
        full[cols] = x
        error = float(np.sum((a @ full - b) ** 2))
        if error < least:
            found, least = full, error
    return Model(*found[1:], fixed=found[0])


def calibrate(comm) -> Model:
    """Fit fixed, α, β, γ on `comm`; collective: every rank calls it, and all get the same.

    It is one collective of the comm's sequence: its messages use the next tag.
    """
    n = comm.Get_size()
    if n == 1:  # nothing is exchanged, nothing to measure
        return DEFAULT
    st = state(comm)
    slot = st.take()
    try:
        return _calibrate(comm, st.tag(slot))
    finally:
        st.release(slot)


def _calibrate(comm, tag: int) -> Model:
    n = comm.Get_size()
    buf = np.zeros(max(SIZES) // 4, np.float32)
    tmp = np.empty_like(buf)
    times = np.array([_fastest(comm, tag, name, buf[: size // 4], tmp[: size // 4])
                      for name, size in PROBES])
    slowest = np.empty_like(times)  # a collective lasts as long as its slowest rank
    run(comm, recursive_doubling_allreduce(comm, slowest, Blocks.even(times.size, n), MAX,
                                           np.empty_like(times), times), tag)
    rows = np.array([terms("allreduce", name, size, n) for name, size in PROBES])
    mine = np.array(fit(rows, slowest))
    # The same inputs give the same fit; a sum over the ranks makes the bits agree even
    # where ranks run different builds of NumPy (a rank choosing differently would deadlock).
    total = np.empty_like(mine)
    run(comm, recursive_doubling_allreduce(comm, total, Blocks.even(mine.size, n), SUM,
                                           np.empty_like(mine), mine), tag)
    return Model(*(total / n))
