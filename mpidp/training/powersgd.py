"""PowerSGD: each gradient matrix sent as two thin factors (Vogels et al., NeurIPS 2019).

A gradient M (m x n) of rank at most r is P Q^T with P (m x r), Q (n x r). One step of
power iteration finds such factors for the average of the ranks' M, with two all-reduces
of thin matrices instead of one of M:

    P = M Q              (m x r)    Q: last step's (warm start), random at the first
    all-reduce P (sum)              P = sum_i M_i Q: the average's, times N
    P = orthonormal(P)              QR: the columns span the average's range
    Q = M^T P            (n x r)
    all-reduce Q, / N               Q = Mbar^T P
    M = P Q^T                       Mbar projected on span(P): Mbar itself if r = min(m, n)

With error feedback the rank adds last step's residual (M - P Q^T, what the
approximation missed) to M first, so nothing is lost, only delayed. Vectors and small
matrices (under ``min_size`` items: the biases, layer norms) travel whole, in the first
all-reduce.

Cost for an m x n matrix: (m + n)·r items all-reduced instead of m·n (plus the small
tensors whole), 2 all-reduces per bucket; compute 4·m·n·r flops of products and a QR of
m x r. Every rank gets the same bits (the all-reduced P and Q are the same, and the
local work is the same code on the same numbers).
"""

from __future__ import annotations

import numpy as np

from .. import collectives as mp
from .gradbucket import GradBucket, Steps


class _State:
    """One bucket's PowerSGD: which gradients are factored, the buffers, the plans."""

    def __init__(self, comm, bucket: GradBucket, width, seed: int, error_feedback: bool):
        self.factored, self.whole = [], []  # (k, m, n, r) / k
        for k, (_, _, shape) in enumerate(bucket.params):
            if width(shape):
                self.factored.append((k, *shape, width(shape)))
            else:
                self.whole.append(k)
        dtype = bucket.buffer.dtype
        sizes = [int(np.prod(bucket.params[k][2])) for k in self.whole]
        self.p = np.zeros(sum(m * r for _, m, _, r in self.factored) + sum(sizes), dtype)
        self.q = np.zeros(sum(n * r for _, _, n, r in self.factored), dtype)
        self.P, self.Q, self.rest = [], [], []  # views of p and q: each matrix's factors
        op = oq = 0
        rng = np.random.default_rng(seed + bucket.index)  # the same Q on every rank
        for _, m, n, r in self.factored:
            self.P.append(self.p[op : op + m * r].reshape(m, r))
            self.Q.append(self.q[oq : oq + n * r].reshape(n, r))
            self.Q[-1][...] = rng.standard_normal((n, r))
            op, oq = op + m * r, oq + n * r
        for size in sizes:
            self.rest.append(self.p[op : op + size])
            op += size
        self.errors = ([np.zeros((m, n), dtype) for _, m, n, _ in self.factored]
                       if error_feedback else None)
        algorithm = bucket.algorithm
        self.plans = [mp.allreduce_init(comm, mp.IN_PLACE, buf, op=mp.SUM, algorithm=algorithm)
                      for buf in (self.p, self.q) if buf.size]  # planned once, in bucket order

    def free(self) -> None:
        for plan in self.plans:
            plan.Free()


class PowerSGD:
    """The PowerSGD hook: rank-`rank` factors of each matrix of at least `min_size` items.

    Args:
        rank: r, the factors' width (clamped to min(m, n) per matrix).
        min_size: matrices smaller than this (and every vector) are all-reduced whole.
        error_feedback: carry each matrix's residual M - P Q^T to the next step.
        seed: of the first Q (the same on every rank).
    """

    def __init__(self, rank: int, min_size: int = 1024, error_feedback: bool = True,
                 seed: int = 0):
        if not (isinstance(rank, int) and rank >= 1):
            raise ValueError(f"PowerSGD rank must be an integer >= 1, not {rank!r}")
        self.rank, self.min_size, self.error_feedback, self.seed = (
            rank, min_size, error_feedback, seed)
        self.states: dict[int, _State] = {}

    def width(self, shape: tuple) -> int:
        """r for a gradient of this shape: min(rank, m, n) for an m x n matrix of at least
        ``min_size`` items (m, n > 1); 0: it travels whole."""
        if len(shape) != 2 or shape[0] * shape[1] < self.min_size or min(shape) < 2:
            return 0
        return min(self.rank, *shape)

    def __call__(self, comm, bucket: GradBucket) -> Steps:
        if bucket.index not in self.states:  # the first launch: the same order on every rank
            self.states[bucket.index] = _State(comm, bucket, self.width, self.seed,
                                               self.error_feedback)
        return Steps(self.steps(comm, bucket, self.states[bucket.index]))

    def steps(self, comm, bucket: GradBucket, s: _State):
        n = comm.Get_size()
        M = []  # noqa: N806 - the paper's names
        for j, (k, _, _, _) in enumerate(s.factored):
            m = bucket.view(k)
            M.append(m + s.errors[j] if s.errors is not None else m.copy())
            np.matmul(M[j], s.Q[j], out=s.P[j])  # P = M Q
        for rest, k in zip(s.rest, s.whole, strict=True):
            rest[...] = bucket.view(k).reshape(-1)
        s.plans[0].Start()
        yield [s.plans[0]]  # all-reduce P and the small tensors
        for rest, k in zip(s.rest, s.whole, strict=True):
            bucket.view(k)[...] = (rest / n).reshape(bucket.params[k][2])
        if not s.factored:
            return
        for j in range(len(s.factored)):
            s.P[j][...] = np.linalg.qr(s.P[j])[0]  # orthonormal columns, span(P) kept
            np.matmul(M[j].T, s.P[j], out=s.Q[j])  # Q = M^T P
        s.plans[1].Start()
        yield [s.plans[1]]  # all-reduce Q
        for j, (k, _, _, _) in enumerate(s.factored):
            s.Q[j] /= n  # the average's; kept as the next step's start
            approx = s.P[j] @ s.Q[j].T
            if s.errors is not None:
                np.subtract(M[j], approx, out=s.errors[j])
            bucket.view(k)[...] = approx

    def close(self) -> None:
        for s in self.states.values():
            s.free()
        self.states = {}
