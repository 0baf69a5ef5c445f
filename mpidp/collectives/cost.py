"""The α-β-γ cost model: calibrate it, predict each algorithm's time, pick the cheapest.

A round of messages costs α (latency: the MPI call, the Python round trip, the
wait for the peers) plus β per byte on the busiest link, and a reduction γ per
reduced byte; a call costs a fixed amount on top, alike for every algorithm:

    time ≈ fixed + rounds·α + bytes·β + reduced bytes·γ

For G bytes on N ranks (q = 2^⌊log2 N⌋, k = log2 q, f = 1 if q < N, else 0,
L = ⌈log2 N⌉); each line is the docstring formula of the algorithm's module:

    allreduce       ring                2(N-1)α + 2G(N-1)/N·β + G(N-1)/N·γ
                    rabenseifner        2kα + 2G(q-1)/q·β + G(q-1)/q·γ + f·(3α + 2Gβ + G/2·γ)
                    recursive_doubling  k(α + Gβ + Gγ) + f·(2α + 2Gβ + Gγ)
                    naive               L(2α + 2Gβ + Gγ)
                    direct              (N-1)(α + Gβ + Gγ)
                    rabenseifner_article  as rabenseifner
                    hierarchical        2(L-1)α + 2G(L-1)/L·β + G(L-1)/L·γ
                                        + 2(H-1)α + 2(G/L)(H-1)/H·β + (G/L)(H-1)/H·γ
                                        (H hosts, at most L ranks on one; one host: the ring)
    reduce_scatter  ring                (N-1)α + G(N-1)/N·(β + γ)
                    recursive_halving   kα + G(q-1)/q·(β + γ) + f·(3α + Gβ + G/2·γ + G/N·β)
    allgather       ring                (N-1)α + G(N-1)/N·β
                    recursive_doubling  kα + G(q-1)/q·β + f·(2α + G/N·β + Gβ)
    bcast           binomial            L(α + Gβ)
                    scatter_allgather   (L + N - 1)α + 2G(N-1)/N·β

(`predict` spells them with p for N and n for G, as Python names.)

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
the bytes through the busiest host link at beta_inter (`placement.link_bytes`:
the ring 1.5G for 2 hosts × 2 ranks, Rabenseifner nearest first and hierarchical
G, the article's order 2G); `placement.calibrate_link` measures beta_inter. On one host, or
with beta_inter 0, nothing is added: the choice is what it was.
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, section 3.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .. import config
from . import placement
from .algorithms.blocks import Blocks
from .algorithms.halving import recursive_doubling_allreduce
from .algorithms.ops import MAX, SUM
from .algorithms.ring import ring_allreduce
from .algorithms.rounds import Rounds
from .engine.driver import run
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
PROBE_ALGORITHMS = {"ring": ring_allreduce, "recursive_doubling": recursive_doubling_allreduce}
SIZES = (8, 1 << 16, 1 << 18, 1 << 20)  # bytes of the whole vector
PROBES = tuple((name, size) for size in SIZES for name in PROBE_ALGORITHMS)
REPS = (10, 3)  # calls per timed batch: small vectors, from 64 KiB up


def predict(m: Model, collective: str, algorithm: str, nbytes: int, p: int,
            hosts: tuple | None = None) -> float:
    """Predicted seconds of `algorithm` for `collective` on `nbytes` (whole vector) and p ranks.

    `hosts`: the placement (`placement`); an all-reduce across hosts adds the bytes through
    the busiest host link at ``m.beta_inter`` (`placement.link_bytes`). None, one host or
    beta_inter 0: the one-level formulas alone.
    """
    a, b, g, n = m.alpha, m.beta, m.gamma, float(nbytes)
    if p == 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    k, f, L = q.bit_length() - 1, float(q < p), (p - 1).bit_length()
    part, qpart = n * (p - 1) / p, n * (q - 1) / q  # all blocks but one
    H = max(hosts) + 1 if hosts else 1
    ppn = max(hosts.count(h) for h in range(H)) if hosts else p  # ranks on the largest host
    local, cross = n * (ppn - 1) / ppn, n / ppn * (H - 1) / H  # hierarchical: within, across
    formulas = {
        ("allreduce", "ring"): lambda: 2 * (p - 1) * a + 2 * part * b + part * g,
        ("allreduce", "rabenseifner"): lambda: (2 * k * a + 2 * qpart * b + qpart * g
                                                + f * (3 * a + 2 * n * b + n / 2 * g)),
        ("allreduce", "recursive_doubling"): lambda: (k * (a + n * b + n * g)
                                                      + f * (2 * a + 2 * n * b + n * g)),
        ("allreduce", "naive"): lambda: L * (2 * a + 2 * n * b + n * g),
        ("allreduce", "direct"): lambda: (p - 1) * (a + n * b + n * g),
        ("allreduce", "rabenseifner_article"): lambda: formulas["allreduce", "rabenseifner"](),
        ("allreduce", "hierarchical"): lambda: (2 * (ppn - 1) * a + 2 * local * b + local * g
                                                + 2 * (H - 1) * a + 2 * cross * b + cross * g),
        ("reduce_scatter", "ring"): lambda: (p - 1) * a + part * (b + g),
        ("reduce_scatter", "recursive_halving"): lambda: (
            k * a + qpart * (b + g) + f * (3 * a + n * b + n / 2 * g + n / p * b)),
        ("allgather", "ring"): lambda: (p - 1) * a + part * b,
        ("allgather", "recursive_doubling"): lambda: (k * a + qpart * b
                                                      + f * (2 * a + n / p * b + n * b)),
        ("bcast", "binomial"): lambda: L * (a + n * b),
        ("bcast", "scatter_allgather"): lambda: (L + p - 1) * a + 2 * part * b,
    }
    link = 0.0
    if collective == "allreduce" and m.beta_inter and placement.spans_hosts(hosts):
        link = placement.link_bytes(algorithm, hosts, n) * m.beta_inter
    return m.fixed + formulas[collective, algorithm]() + link


@lru_cache(maxsize=4096)  # a trainer asks about the same few bucket sizes every step
def best(m: Model, collective: str, names: tuple, nbytes: int, p: int,
         hosts: tuple | None = None) -> str:
    """The name in `names` with the smallest predicted time (ties: the first listed)."""
    return min(names, key=lambda name: predict(m, collective, name, nbytes, p, hosts))


# ------------------------------------------------------------ the per-comm model

def choose(comm, collective: str, names: tuple, nbytes: int) -> str:
    """`best` of the collective's algorithms `names` under the comm's model, remembered.

    The model and the answers live in the comm's state (`state.state`): a small
    collective pays for this before its first message, so a repeated question
    costs one dict lookup.
    """
    st = state(comm)
    question = (collective, nbytes)
    name = st.choices.get(question)
    if name is None:
        hosts = placement.placement(comm)  # learned once, where every rank comes in order
        m = model(comm)
        if len(st.choices) > 4096:  # a run with ever new sizes: start again
            st.choices.clear()
        name = st.choices[question] = best(m, collective, names, nbytes, comm.Get_size(),
                                           hosts if placement.spans_hosts(hosts) else None)
    return name


def set_model(comm, alpha: float, beta: float, gamma: float, fixed: float = 0.0,
              beta_inter: float = 0.0) -> Model:
    """Use this model for `comm` from now on. Call it on every rank with the same numbers."""
    m = Model(float(alpha), float(beta), float(gamma), float(fixed), float(beta_inter))
    st = state(comm)
    st.model, st.choices, st.setups = m, {}, {}  # answers under the old model are stale
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
            if placement.spans_hosts(hosts):  # one host: nothing changes
                m = m._replace(beta_inter=placement.calibrate_link(comm, hosts))
        m = set_model(comm, *m)
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
    unit = (Model(1, 0, 0), Model(0, 1, 0), Model(0, 0, 1))
    return np.array([1.0, *(predict(m, collective, algorithm, nbytes, p) for m in unit)])


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

