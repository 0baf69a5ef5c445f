"""The α-β-γ cost model: calibrate it, predict each algorithm's time, pick the cheapest.

A round of messages costs α (latency: the MPI call, the Python round trip) plus
β per byte on the busiest link, and a reduction γ per reduced byte:

    time ≈ rounds·α + bytes·β + reduced bytes·γ

For n bytes on p ranks (q = 2^⌊log2 p⌋, k = log2 q, f = 1 if q < p, else 0,
L = ⌈log2 p⌉); each line is the docstring formula of the algorithm's module:

    allreduce       ring                2(p-1)α + 2n(p-1)/p·β + n(p-1)/p·γ
                    rabenseifner        2kα + 2n(q-1)/q·β + n(q-1)/q·γ + f·(3α + 2nβ + n/2·γ)
                    recursive_doubling  k(α + nβ + nγ) + f·(2α + 2nβ + nγ)
                    naive               L(2α + 2nβ + nγ)
    reduce_scatter  ring                (p-1)α + n(p-1)/p·(β + γ)
                    recursive_halving   kα + n(q-1)/q·(β + γ) + f·(3α + nβ + n/2·γ + n/p·β)
    allgather       ring                (p-1)α + n(p-1)/p·β
                    recursive_doubling  kα + n(q-1)/q·β + f·(2α + n/p·β + nβ)
    bcast           binomial            L(α + nβ)
                    scatter_allgather   (L + p - 1)α + 2n(p-1)/p·β

Small messages want few rounds (recursive doubling, binomial), large ones few
bytes (ring, Rabenseifner, scatter + all-gather).

Calibration (`calibrate`) is collective: ranks pair up (rank ^ 1) and time
rounds of one exchange at a few sizes through the schedule driver, with the
comm's own point-to-point calls, which gives α (the smallest size) and β (the
slope), each the fastest of three batches; γ is the extra time of the same
exchange when each round also sums what it received (freshly received data is
cold in this core's cache: summing it costs several times a warm sum). The
ranks then average their numbers with a tiny all-reduce, so
every rank holds the same model and `best` makes the same choice on every rank:
a rank that chose differently from the others would deadlock. It takes a few
milliseconds, never runs on import, and is cached per communicator (as an MPI
attribute: a duplicate communicator calibrates again). ``MPIDP_COST=default``
or ``MPIDP_COST=alpha,beta,gamma`` in the environment, or `set_model`, skip it.
Reference: Thakur, Rabenseifner, Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, section 3.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from .blocks import Blocks
from .halving import recursive_doubling_allreduce
from .ops import SUM
from .schedule import Recv, Send, run


class Model(NamedTuple):
    """Seconds per message (alpha), per byte sent (beta), per byte reduced (gamma)."""

    alpha: float
    beta: float
    gamma: float


# A shared-memory node running mpidp from Python: about 15 µs a round, 2 GB/s, 1 GB/s.
DEFAULT = Model(alpha=15e-6, beta=0.5e-9, gamma=1e-9)

SIZES = (8, 1 << 16, 1 << 20)  # bytes per message in the calibration exchange
REPS = (20, 6, 3)  # rounds per timed batch


def predict(m: Model, collective: str, algorithm: str, nbytes: int, p: int) -> float:
    """Predicted seconds of `algorithm` for `collective` on `nbytes` (whole vector) and p ranks."""
    a, b, g, n = m.alpha, m.beta, m.gamma, float(nbytes)
    if p == 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    k, f, L = q.bit_length() - 1, float(q < p), (p - 1).bit_length()
    part, qpart = n * (p - 1) / p, n * (q - 1) / q  # all blocks but one
    formulas = {
        ("allreduce", "ring"): lambda: 2 * (p - 1) * a + 2 * part * b + part * g,
        ("allreduce", "rabenseifner"): lambda: (2 * k * a + 2 * qpart * b + qpart * g
                                                + f * (3 * a + 2 * n * b + n / 2 * g)),
        ("allreduce", "recursive_doubling"): lambda: (k * (a + n * b + n * g)
                                                      + f * (2 * a + 2 * n * b + n * g)),
        ("allreduce", "naive"): lambda: L * (2 * a + 2 * n * b + n * g),
        ("reduce_scatter", "ring"): lambda: (p - 1) * a + part * (b + g),
        ("reduce_scatter", "recursive_halving"): lambda: (
            k * a + qpart * (b + g) + f * (3 * a + n * b + n / 2 * g + n / p * b)),
        ("allgather", "ring"): lambda: (p - 1) * a + part * b,
        ("allgather", "recursive_doubling"): lambda: (k * a + qpart * b
                                                      + f * (2 * a + n / p * b + n * b)),
        ("bcast", "binomial"): lambda: L * (a + n * b),
        ("bcast", "scatter_allgather"): lambda: (L + p - 1) * a + 2 * part * b,
    }
    return formulas[collective, algorithm]()


@lru_cache(maxsize=4096)  # a trainer asks about the same few bucket sizes every step
def best(m: Model, collective: str, names: tuple, nbytes: int, p: int) -> str:
    """The name in `names` with the smallest predicted time (ties: the first listed)."""
    return min(names, key=lambda name: predict(m, collective, name, nbytes, p))


# ------------------------------------------------------------ the per-comm model

_keyval = None


def _key() -> int:
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval()
    return _keyval


def set_model(comm, alpha: float, beta: float, gamma: float) -> Model:
    """Use this model for `comm` from now on. Call it on every rank with the same numbers."""
    m = Model(float(alpha), float(beta), float(gamma))
    comm.Set_attr(_key(), m)
    return m


def model(comm, tag: int) -> Model:
    """The comm's model: cached, or from ``MPIDP_COST``, or calibrated now (collective)."""
    m = comm.Get_attr(_key())
    if m is None:
        env = os.environ.get("MPIDP_COST", "").strip()
        if env == "default":
            m = DEFAULT
        elif env:
            m = Model(*(float(x) for x in env.split(",")))
        else:
            m = calibrate(comm, tag)
        set_model(comm, *m)
    return m


def _exchanges(partner: int, send, recv, reps: int, acc=None):
    """`reps` rounds of one exchange with `partner`: what a round of a collective costs.

    With `acc`, each round also adds what it received into `acc`, as a reduction
    round does: data just written by another process is not in this core's cache,
    and reducing it costs several times what the same sum costs on warm data.
    """
    for _ in range(reps):
        yield [Send(send, partner), Recv(recv, partner)]
        if acc is not None:
            SUM(acc, recv.view(acc.dtype))


def _fastest(comm, tag: int, make_rounds, reps: int) -> float:
    """Seconds per round: the fastest of 3 batches (other processes only add time)."""
    run(comm, make_rounds(1), tag)  # warm up
    samples = []
    for _ in range(3):
        rounds = make_rounds(reps)
        t0 = time.perf_counter()
        run(comm, rounds, tag)
        samples.append((time.perf_counter() - t0) / reps)
    return min(samples)


def calibrate(comm, tag: int) -> Model:
    """Measure α, β, γ on `comm` (collective: every rank must call it); all ranks get the same."""
    rank, n = comm.Get_rank(), comm.Get_size()
    partner = rank ^ 1
    mine = np.zeros(4)  # alpha, beta, gamma, 1 if I had a partner (so they stay 0 if not)
    if partner < n:
        send, recv = np.zeros(SIZES[-1], np.uint8), np.empty(SIZES[-1], np.uint8)
        times = []
        for size, reps in zip(SIZES, REPS, strict=True):
            times.append(_fastest(comm, tag, lambda r, k=size: _exchanges(
                partner, send[:k], recv[:k], r), reps))
        beta = max((times[-1] - times[1]) / (SIZES[-1] - SIZES[1]), 1e-12)
        size = SIZES[1]  # γ: the same exchange, plus the reduction of what arrived
        acc = np.zeros(size // 4, np.float32)
        with_sum = _fastest(comm, tag, lambda r: _exchanges(
            partner, send[:size], recv[:size], r, acc), REPS[1])
        gamma = max((with_sum - times[1]) / size, 1e-12)
        mine[:] = max(times[0], 1e-7), beta, gamma, 1.0
    run(comm, recursive_doubling_allreduce(comm, mine, Blocks.even(4, n), SUM, np.empty(4)), tag)
    if mine[3] == 0:  # a single rank: nothing exchanged, nothing measured
        return DEFAULT
    return Model(*(mine[:3] / mine[3]))
