"""The sweeps against the MPI library that test_halving.py, test_tree.py and test_direct.py
run in their launches, each for its own algorithms.

Inputs are small integers, stored in whatever dtype is tested, so sums, products and
averages are exact in every summation order and results must equal MPI's bit for bit;
one random-float case checks the tolerance that summation order allows.
"""

from contextlib import contextmanager

import numpy as np

from helpers.oracle import DTYPES, OPS, assert_same, make_input, native_allreduce, valid
from helpers.oracle import counts_for as oracle_counts
from mpidp.collectives import CountingComm, api, checks

LARGE = (4, 7)  # the 1 Mi-item cases run at these N only (one power of two, one not)


@contextmanager
def debug_check_off():
    """MPIDP_DEBUG's agreement check off (its own messages would be counted), then back to
    what the environment says: conftest's `no_debug_check` for a part of a test."""
    checks.set_debug(False)
    try:
        yield
    finally:
        checks.set_debug(None)


def counts_for(n: int) -> list[int]:
    """The oracle's count shapes (0, 1, < N, N, not divisible by N, a prime), and 101."""
    return sorted({*oracle_counts(n), 101})


def dtype_ops():
    """Every (dtype, op) that MPI defines (the oracle's: logical and bitwise ops too)."""
    for dtype in DTYPES:
        for op in OPS:
            if valid(op, dtype):
                yield dtype, op


def combos(n):
    """(dtype, op, count) for every (dtype, op); the counts rotate, each used a dozen times."""
    counts = counts_for(n)
    for i, (dtype, op) in enumerate(dtype_ops()):
        for count in counts[i % 3 :: 3]:
            yield dtype, op, count


def same_on_every_rank(comm, y) -> bool:
    rows = np.empty((comm.Get_size(), y.nbytes), np.uint8)
    comm.Allgather(y.view(np.uint8), rows)
    return bool((rows == rows[0]).all())


def check_allreduce_matches_mpi_bit_for_bit(comm, algorithms):
    for dtype, op, count in combos(comm.Get_size()):
        x = make_input(op, dtype, count, comm.Get_rank(), seed=100)
        ref = native_allreduce(comm, x, op)
        for algo in algorithms:
            y = np.full_like(x, 7)
            api.allreduce(comm, x, y, op, algorithm=algo)
            assert_same(y, ref, f"{algo} {dtype} {op} count={count}")
            if dtype != "float64":
                continue
            inplace = x.copy()
            api.allreduce(comm, api.IN_PLACE, inplace, op, algorithm=algo)
            assert_same(inplace, ref, f"{algo} {dtype} {op} count={count} in place")


def check_allreduce_random_floats_agree_across_ranks(comm, algorithms):
    """Rounding differs from MPI's by summation order only, and every rank gets the same bits
    (the 1 Mi-item floats: Rabenseifner only)."""
    n = comm.Get_size()
    rng = np.random.default_rng(7 + comm.Get_rank())
    for count in (n + 1, 1000, 1 << 20) if n in LARGE else (n + 1, 1000):  # 1 Mi items: 8 MiB
        x = rng.standard_normal(count)
        ref = native_allreduce(comm, x, "sum")
        bound = np.empty_like(x)
        comm.Allreduce(np.abs(x), bound)
        for algo in [a for a in algorithms if count < 1 << 20 or a == "rabenseifner"]:
            for op in ("sum", "avg"):
                y = np.empty_like(x)
                api.allreduce(comm, x, y, op, algorithm=algo)
                # n terms summed in any order: error <= (n-1)·eps·sum|x|
                scale = 1.0 / n if op == "avg" else 1.0
                assert np.all(np.abs(y - ref * scale) <= n * 2.3e-16 * bound * scale), algo
                assert same_on_every_rank(comm, y), (algo, op, count)
    if n not in LARGE:
        return
    big = rng.integers(-3, 3, 1 << 20).astype(np.int32)  # large, exact: every algorithm
    ref = native_allreduce(comm, big, "sum")
    for algo in algorithms:
        y = np.empty_like(big)
        api.allreduce(comm, big, y, algorithm=algo)
        assert np.array_equal(y, ref), algo


def traffic(comm, start):
    """Run a nonblocking collective through a CountingComm: (bytes sent, rounds) of this rank."""
    counter = CountingComm(comm)
    handle = start(counter)
    handle.wait()
    return counter.bytes_sent, handle.rounds
