"""EXACT_SUM in the simulator: its order-independence checked, its bytes counted.

    python -m mpidp.sim check ring --exact --ranks 1-64     # or: check all --exact
    python -m mpidp.sim volume --exact --ranks 2,4,8,64

`check_exact` runs the exact all-reduce (and reduce-scatter) of every algorithm on
N simulated ranks, for every N in the range, and requires every rank's result to
be bitwise the one-rank sum of the same addends (`api.sum_parts`: all of them
as parts on one rank), for float64, float32 and float16 and every count shape;
hard addends (cancellations, the whole exponent range, subnormals, inf and nan).
It also spreads more addends than ranks unevenly (some ranks hold none), few
enough for the direct path and more than three a rank for the words path
(`exact_direct.takes_direct`), and asks for the same bits again.
"""

from __future__ import annotations

import numpy as np

from mpidp.collectives.algorithms import REGISTRY, entry
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.fold import fold
from mpidp.collectives.algorithms.prerounding import grid
from mpidp.collectives.api import sum_parts
from mpidp.collectives.engine.staging import ScratchPool
from mpidp.collectives.exact import CODE_FOR, GATHER_FOR, exact_rounds
from mpidp.collectives.exact_direct import (
    chunk_items,
    direct_items,
    direct_rounds,
    takes_direct,
)
from mpidp.collectives.exact_steps import local_sum, scratch_for

from .engine import Sim

DTYPES = ("float64", "float32", "float16")

EXACT_NOTE = """\
EXACT_SUM with one addend a rank (and sums of parts with up to three a rank on
average) takes the direct path: block j of every addend goes, raw, to rank j, which
sums its items where it is, and the chosen algorithm all-gathers the sums: SUM's
bytes with one addend a rank. More addends a rank take the words path: a MAX
all-reduce of a code per item (G/4 for float64 and float32) and the SUM all-reduce
of two float64 words per float64 item (one per float32 item: 2G), 2.25 times SUM's
bytes (float16 4.5 times) in twice its rounds."""


def hard_addends(count: int, n: int, dtype, seed: int = 0) -> list[np.ndarray]:
    """`n` addends of `count` items that make float sums disagree: huge cancellations,
    the whole exponent range, subnormals, exact zeros of both signs, some inf and nan."""
    rng = np.random.default_rng([seed, count, n])
    dt = np.dtype(dtype)
    info = np.finfo(dt)
    lo, hi = np.log2(float(info.smallest_subnormal)), np.log2(float(info.max))
    out = []
    for _ in range(n):
        mag = np.exp2(rng.uniform(lo, hi - 1, count))
        x = (rng.choice([-1.0, 1.0], count) * mag).astype(dt)
        kind = rng.integers(0, 16, count)
        x[kind == 0] = rng.choice([0.0, -0.0], int(np.sum(kind == 0)))
        x[kind == 1] = np.float64(info.max) * rng.choice([-1, 1], int(np.sum(kind == 1)))
        x[kind == 2] = rng.integers(-3, 4, int(np.sum(kind == 2))) * info.smallest_subnormal
        x[kind == 3] = rng.standard_normal(int(np.sum(kind == 3)))  # ordinary magnitudes
        out.append(x)
    if count and n > 1:  # cancellation: one addend is minus another, one item a NaN, one inf
        out[-1][: count // 2] = -out[0][: count // 2]
        out[rng.integers(n)][rng.integers(count)] = np.nan
        out[rng.integers(n)][rng.integers(count)] = np.inf
    return out


def simulate_exact(algorithm: str, parts_by_rank, addends: int, *,
                   collective: str = "allreduce", counts=None, average: bool = False,
                   placement=None, known=None):
    """Run the exact all-reduce (or reduce-scatter, with per-rank `counts`) of `algorithm`
    on ``len(parts_by_rank)`` simulated ranks; return (each rank's result, the `Sim`).

    `known`: every rank holds one part and knows it (EXACT_SUM's op: the direct path
    swaps no counts); by default, where every rank holds one."""
    N = len(parts_by_rank)
    dtype = np.dtype(next(p.dtype for parts in parts_by_rank for p in parts))
    size = next(p.size for parts in parts_by_rank for p in parts)
    g = grid(dtype, addends, average)
    rs = collective == "reduce_scatter"
    blocks = Blocks(counts) if rs else None
    code_name = CODE_FOR[algorithm] if rs else algorithm
    hosts = None if placement is None else tuple(placement)
    code, word = entry("allreduce", code_name), entry(collective, algorithm)
    code_algo, code_scratch = code.bound(hosts), code.scratch
    word_algo, word_scratch = word.bound(hosts), word.scratch
    word_blocks = (Blocks([c * g.words for c in counts]) if rs
                   else Blocks.even(size * g.words, N))
    sim = Sim(N, placement=hosts)
    gens, results = [], []
    if takes_direct(g, N):
        if known is None:
            known = all(len(parts) == 1 for parts in parts_by_rank)
        layout = blocks if rs else Blocks.even(size, N)
        gather = None if rs else entry("allgather", GATHER_FOR.get(algorithm,
                                                                     "recursive_doubling"))
        for r, comm in enumerate(sim.comms):
            out = np.full(layout.counts[r], 77, dtype) if rs else np.full(size, 77, dtype)
            mine = [p.copy() for p in parts_by_rank[r]]
            s = scratch_for(ScratchPool(), g, chunk_items(layout.counts[r], dtype), 0, 0)
            recv = np.empty(direct_items(g, layout, r, len(mine)), dtype)
            gens.append(direct_rounds(comm, mine, out, g, gather and gather.bound(hosts), s,
                                      recv, np.zeros(0 if known else N, np.int64),
                                      local_sum, average, blocks, [1] * N if known else None))
            results.append(out)
        sim.run(gens)
        return results, sim
    for r, comm in enumerate(sim.comms):
        out = np.full(blocks.counts[r] if rs else size, 77, dtype)
        s = scratch_for(ScratchPool(), g, size, code_scratch(Blocks.even(size, N)),
                        word_scratch(word_blocks))
        gens.append(exact_rounds(comm, [p.copy() for p in parts_by_rank[r]], out, g, code_algo,
                                 word_algo, s, average, blocks))
        results.append(out)
    sim.run(gens)
    return results, sim


def _same(a, b) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def check_exact(algorithm: str, collective: str = "allreduce", ranks=range(1, 65),
                dtypes=DTYPES, quick: bool = False) -> tuple[bool, int, str]:
    """Every N in `ranks`: the exact sum bitwise equal to one rank's on the same addends
    (`quick`: two count shapes per N, not six).

    Returns (ok, cases run, the first failure or "").
    """
    from .conformance import counts_for

    cases = 0
    for N in ranks:
        shapes = counts_for(N)
        if quick:  # one small shape in turn, and the large one
            shapes = [shapes[N % 5], shapes[-1]]
        for j, count in enumerate(shapes):
            dtype = dtypes[(N + j) % len(dtypes)]
            if collective == "reduce_scatter":
                counts = Blocks.even(count, N).counts
            else:
                counts = None
            # one addend a rank, and more spread unevenly: the direct path (n <= 3N);
            # more than three a rank on average: the words path (exact.exact_rounds)
            for spread, n in ((False, N), (True, N + 3), (True, 3 * N + 2)):
                addends = hard_addends(count, n, dtype, seed=N)
                one = np.empty(count, dtype)
                sum_parts(addends, one)
                if spread:  # rank q holds the addends i with owner[i] == q (some none)
                    owner = np.random.default_rng(N).integers(0, max(N - 1, 1), n)
                    by_rank = [[a for a, o in zip(addends, owner, strict=True) if o == q]
                               for q in range(N)]
                else:
                    by_rank = [[a] for a in addends]
                results, _ = simulate_exact(algorithm, by_rank, n, collective=collective,
                                            counts=counts)
                cases += 1
                blocks = Blocks(counts) if counts is not None else None
                for r, got in enumerate(results):
                    want = one if blocks is None else blocks.view(one, r)
                    if not _same(got, want):
                        bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
                        return False, cases, (
                            f"{algorithm} ({collective}), N = {N}, count = {count}, {dtype}, "
                            f"{n} addends{' spread unevenly' if spread else ''}: rank {r} "
                            f"differs from one rank's exact sum (bytes {bad[:6].tolist()})")
    return True, cases, ""


def exact_volume(ranks, algorithms=None, dtype="float64") -> list[dict]:
    """Bytes per rank of EXACT_SUM's all-reduce as multiples of G (the vector's bytes):
    the MAX pass and the SUM pass together."""
    rows = []
    for N in ranks:
        q = fold(N)[0]  # the largest power of two <= N
        count = 2 * N * q // np.gcd(N, q)
        for name in algorithms or tuple(REGISTRY["allreduce"]):
            by_rank = [[np.ones(count, dtype)] for _ in range(N)]
            _, sim = simulate_exact(name, by_rank, N)
            G = count * np.dtype(dtype).itemsize
            rows.append({"N": N, "algorithm": name, "steps": sim.steps,
                         "sent": max(sim.bytes_sent) / G, "sent_min": min(sim.bytes_sent) / G,
                         "recv": max(sim.bytes_received) / G,
                         "recv_min": min(sim.bytes_received) / G})
    return rows
