"""Inputs and oracles for the collective tests: the MPI library computes the expected answer.

Every rank builds its input from (seed, rank), so a test can also rebuild any
other rank's input. Values are chosen so that MPI's own result is exact where
it can be (small integers, integer-valued floats), which lets the comparison be
exact for integers and for sums of integer-valued floats; random-valued floats
get a tolerance from the summation order (N terms: rtol = N·eps).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from mpidp.collectives.algorithms import ops as O

DTYPES = ["int32", "int64", "uint8", "float16", "float32", "float64", "complex128"]
OPS = {  # our op -> MPI's op (avg: MPI sum / N)
    "sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "avg": MPI.SUM,
    "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
    "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
}


def counts_for(n: int) -> list[int]:
    """0, 1, below N, N, not divisible by N, a prime."""
    return sorted({0, 1, max(n - 1, 0), n, n + 1, 2 * n + 1, 13})


def valid(op: str, dtype: str) -> bool:
    return np.dtype(dtype).kind in O.OPS[op].kinds


def make_input(op: str, dtype: str, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """This rank's input: small values so that MPI's answer is exact (no overflow either)."""
    rng = np.random.default_rng([seed, rank, count, len(dtype), len(op)])
    dt = np.dtype(dtype)
    if op == "prod":
        vals = rng.choice([1, 1, 2, -1] if dt.kind != "u" else [1, 1, 2], size=count)
    elif op in ("land", "lor", "lxor"):
        vals = rng.integers(0, 2, size=count)
    elif op in ("band", "bor", "bxor"):
        vals = rng.integers(0, 128, size=count)
    elif dt.kind == "u":
        vals = rng.integers(0, 30, size=count)
    else:
        vals = rng.integers(-30, 30, size=count)
    x = vals.astype(dt)
    if dt.kind == "c":
        x = x + 1j * rng.integers(-5, 5, size=count)
    return x


def native_allreduce(comm, x: np.ndarray, op: str) -> np.ndarray:
    """MPI's own Allreduce of x (float16 goes through float32, which MPI knows)."""
    wire = x.astype(np.float32) if x.dtype == np.float16 else x
    out = np.empty_like(wire)
    comm.Allreduce(wire, out, op=OPS[op])
    if op == "avg":
        out = out / comm.Get_size()
    return out.astype(x.dtype)


def native_reduce_scatter(comm, x: np.ndarray, counts, op: str) -> np.ndarray:
    wire = x.astype(np.float32) if x.dtype == np.float16 else x
    out = np.empty(counts[comm.Get_rank()], dtype=wire.dtype)
    comm.Reduce_scatter(wire, out, list(counts), op=OPS[op])
    if op == "avg":
        out = out / comm.Get_size()
    return out.astype(x.dtype)


def native_allgather(comm, x: np.ndarray, counts) -> np.ndarray:
    wire = x.view(np.uint8)
    size = x.dtype.itemsize
    out = np.empty(sum(counts) * size, dtype=np.uint8)
    comm.Allgatherv(wire, [out, [c * size for c in counts], MPI.BYTE])
    return out.view(x.dtype)


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Exact for integers and for our small integer-valued floats."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)[:5]
        raise AssertionError(f"{what}: {bad.size}+ items differ, e.g. at {bad.tolist()}: "
                             f"got {got[bad].tolist()}, want {want[bad].tolist()}")
