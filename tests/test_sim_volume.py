"""Bytes and rounds per rank, counted by the simulator while the unchanged code runs, for N = 1
to 64: the formulas of the docstrings and of the article, asserted rank by rank.

G is the vector's bytes, q = 2^floor(log2 N) the ranks of the halving/doubling main
loop, r = N - q the ranks folded into a partner (ranks 0, 2, ..., 2r-2 idle).
"""

import math
import os
import subprocess
import sys
import time

import pytest

from mpidp.collectives.algorithms.halving import fold
from mpidp.sim import simulate

RANKS = range(1, 65)


def count_for(N: int) -> int:
    """Whole blocks for N and for q, and an even count (the fold splits the vector in halves)."""
    q = fold(N)[0]
    return 2 * N * q // math.gcd(N, q)


def children(v: int, N: int) -> int:
    """Children of relative rank v in the binomial tree of N ranks."""
    low = v & -v if v else 1 << N.bit_length()
    return sum(1 for j in range(N.bit_length()) if (1 << j) < low and v + (1 << j) < N)


def per_rank(collective, algorithm, N, **kw):
    count = count_for(N)
    out = simulate(collective, algorithm, N, count, dtype="int16", **kw)
    assert not out.problems()
    return out.sim, count * 2  # the counters, G


@pytest.mark.parametrize("N", RANKS)
def test_allreduce_bytes_sent_and_received_per_rank(N):
    q, r = fold(N)
    k = q.bit_length() - 1

    s, G = per_rank("allreduce", "ring", N)  # the article's D = 2·G·(N-1)/N, each way
    assert s.bytes_sent == s.bytes_received == [2 * G * (N - 1) // N] * N
    assert s.rounds == [2 * (N - 1)] * N and s.steps == 2 * (N - 1)

    s, G = per_rank("allreduce", "direct", N)  # the article's first estimate: G·(N-1) each way
    assert s.bytes_sent == s.bytes_received == [G * (N - 1)] * N
    assert s.rounds == [1 if N > 1 else 0] * N

    s, G = per_rank("allreduce", "rabenseifner", N)
    main = 2 * G * (q - 1) // q
    for rank in range(N):
        if rank < 2 * r and rank % 2 == 0:  # hands its upper half, then its reduced lower half
            want = (G, G // 2 + G, 3)
        elif rank < 2 * r:  # also hands the result back
            want = (G // 2 + main + G, G + main, 2 * k + 3)
        else:
            want = (main, main, 2 * k)
        assert (s.bytes_sent[rank], s.bytes_received[rank], s.rounds[rank]) == want, rank

    s, G = per_rank("allreduce", "recursive_doubling", N)
    for rank in range(N):
        if rank < 2 * r and rank % 2 == 0:
            want = (G, G, 2)
        elif rank < 2 * r:
            want = (G * k + G, G * k + G, k + 2)
        else:
            want = (G * k, G * k, k)
        assert (s.bytes_sent[rank], s.bytes_received[rank], s.rounds[rank]) == want, rank

    s, G = per_rank("allreduce", "naive", N)  # reduce to 0, then broadcast: the same tree twice
    for rank in range(N):
        links = children(rank, N) + (rank != 0)
        assert s.bytes_sent[rank] == s.bytes_received[rank] == G * links, rank
    assert s.bytes_sent[0] == G * (N - 1).bit_length()  # the root: G to each of its L children


@pytest.mark.parametrize("N", RANKS)
def test_reduce_scatter_allgather_bcast_bytes_per_rank(N):
    q, r = fold(N)
    k = q.bit_length() - 1
    s, G = per_rank("reduce_scatter", "ring", N)
    b = G // N
    assert s.bytes_sent == s.bytes_received == [G - b] * N
    s, G = per_rank("reduce_scatter", "recursive_halving", N)
    for rank in range(N):
        if rank < 2 * r and rank % 2 == 0:
            want = (G, 3)
        elif rank < 2 * r:  # G/2 before, the main loop without its virtual block (2b), 1 after
            want = (G // 2 + (G - 2 * b) + b, k + 3)
        else:
            want = (G - b, k)
        assert (s.bytes_sent[rank], s.rounds[rank]) == want, rank

    s, G = per_rank("allgather", "ring", N)
    assert s.bytes_sent == s.bytes_received == [G - b] * N
    s, G = per_rank("allgather", "recursive_doubling", N)
    if r == 0:
        assert s.bytes_sent == s.bytes_received == [G * (q - 1) // q] * N
    assert sum(s.bytes_sent) == r * b + (q - 1) * G + r * G
    assert s.rounds == [2 if rank < 2 * r and rank % 2 == 0 else k + 2 if rank < 2 * r else k
                        for rank in range(N)]

    s, G = per_rank("bcast", "binomial", N)
    assert s.bytes_sent == [G * children(v, N) for v in range(N)]
    assert s.bytes_received == [0] + [G] * (N - 1)
    s, G = per_rank("bcast", "scatter_allgather", N)
    if N > 1:  # the scatter, then its share of the ring all-gather
        assert s.bytes_sent[0] == G * (N - 1) // N + (N - 1) * b
        assert s.bytes_received[0] == (N - 1) * b


@pytest.mark.parametrize("N", [2, 4, 8, 16, 32, 64])
def test_steps_and_reductions_at_powers_of_two(N):
    """The α and γ columns of docs/algorithms.md: steps (rounds on the critical path) and the
    items each rank reduces, per algorithm."""
    k, count = N.bit_length() - 1, count_for(N)
    want = {  # (steps, items reduced by the rank that reduces the most)
        ("allreduce", "ring"): (2 * (N - 1), count * (N - 1) // N),
        ("allreduce", "rabenseifner"): (2 * k, count * (N - 1) // N),
        ("allreduce", "recursive_doubling"): (k, count * k),
        ("allreduce", "naive"): (2 * k, count * k),  # rank 0 adds its k children's vectors
        ("allreduce", "direct"): (1, count * (N - 1)),
        ("reduce_scatter", "ring"): (N - 1, count * (N - 1) // N),
        ("reduce_scatter", "recursive_halving"): (k, count * (N - 1) // N),
        ("allgather", "ring"): (N - 1, 0),
        ("allgather", "recursive_doubling"): (k, 0),
        ("bcast", "binomial"): (k, 0),
        ("bcast", "scatter_allgather"): (k + N - 1, 0),
    }
    for (collective, name), (steps, reduced) in want.items():
        out = simulate(collective, name, N, count, dtype="int16")
        assert (out.sim.steps, max(out.sim.reduced)) == (steps, reduced), (collective, name)


def test_volume_command_prints_the_article_s_numbers():
    done = subprocess.run([sys.executable, "-m", "mpidp.sim", "volume", "--ranks", "2,4,8,64"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    row = next(line for line in lines if line.startswith("    64 |")).split("|")
    assert row[1].split() == ["1.969", "/", "1.969"]  # ring: 2·63/64
    assert row[5].split() == ["63.000", "/", "63.000"]  # direct: N - 1
    assert "D = D_send + D_recv = 2·G·(N-1)/N" in done.stdout


def test_a_256_rank_ring_runs_in_seconds():
    t0 = time.process_time()
    s, G = per_rank("allreduce", "ring", 256)
    assert s.steps == 510 and s.bytes_sent[0] == 2 * G * 255 // 256
    assert time.process_time() - t0 < 15  # about 0.4 s here; 1024 ranks: 9 s (docs/simulator.md)


@pytest.mark.skipif(not os.environ.get("MPIDP_SIM_1024"), reason="1024 ranks take ~10 s of CPU; "
                    "MPIDP_SIM_1024=1 runs it")
def test_1024_ranks():
    t0 = time.process_time()
    out = simulate("allreduce", "ring", 1024, 1024, dtype="float32")
    assert not out.problems() and out.sim.steps == 2046
    assert time.process_time() - t0 < 60
