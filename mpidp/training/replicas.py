"""Identical replicas: every rank starts from rank 0's weights, and can check that it holds them."""

from __future__ import annotations

import hashlib

import numpy as np

from .. import collectives as mp


def replicate(model, comm) -> None:
    """Every replica starts from rank 0's weights."""
    for p in model.params.values():
        mp.bcast(comm, p, root=0)


def check_replicas(params: dict, comm) -> None:
    """Raise RuntimeError unless every rank holds bitwise-identical `params` (name -> array).

    Each rank hashes its parameters; the ranks all-gather the 32-byte digests.
    """
    digest = hashlib.sha256()
    for name, p in params.items():
        digest.update(name.encode())
        digest.update(mp.as_host(p).tobytes())
    mine = np.frombuffer(digest.digest(), dtype=np.uint8).copy()  # (32,)
    n = comm.Get_size()
    table = np.zeros(n * mine.size, dtype=np.uint8)  # (n * 32,)
    mp.allgather(comm, mine, table)
    rows = table.reshape(n, mine.size)
    differ = [r for r in range(n) if not np.array_equal(rows[r], rows[0])]
    if differ:
        raise RuntimeError(f"parameters on ranks {differ} differ from rank 0's")
