"""Argument checks, made once at a collective's entry, before any message.

Local checks (`check_buffer`, `check_pair`) raise on the rank that got the bad
argument: ``TypeError`` for a wrong kind of buffer or dtype, ``ValueError`` for
wrong sizes. No buffer of Python objects is ever sent: its bytes are pointers.

Ranks that disagree (count, dtype, op, root, algorithm) make an erroneous
program, which MPI libraries do not detect. mpidp guards against it twice:

- always: a signature of the call is folded into its tags (`state.signature`),
  so mismatched calls cannot exchange data; they stall until a deadline ends
  them, instead of returning a wrong answer;
- with ``MPIDP_DEBUG=1`` in the environment (or ``debug=True`` per call or per
  `mpidp.Comm`), `agree` first compares every rank's description of the call,
  in full, and every rank raises the same ``ValueError`` naming each rank's
  values. It costs one small all-gather per collective (two where they differ).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from .blocks import Blocks
from .buffers import array_module
from .ops import Op
from .ring import ring_allgather
from .schedule import run

_DEBUG = os.environ.get("MPIDP_DEBUG", "") not in ("", "0")  # read once: environ costs ~1 µs


def debug_enabled(asked: bool = False) -> bool:
    """Run the agreement check? ``MPIDP_DEBUG=1`` turns it on whatever the call says."""
    return asked or _DEBUG


def set_debug(on: bool) -> None:
    """Turn the environment's check on or off for this process (tests that count bytes)."""
    global _DEBUG
    _DEBUG = bool(on)


def check_buffer(arr, what: str, writable: bool = False) -> None:
    """Raise unless `arr` is a contiguous NumPy/CuPy array of plain data (writable if asked)."""
    if not hasattr(arr, "dtype") or not hasattr(arr, "flags"):
        raise TypeError(f"{what} must be a NumPy or CuPy array, not {type(arr).__name__}")
    if arr.dtype.hasobject:
        raise TypeError(f"{what} has dtype {arr.dtype}, which holds Python objects: their "
                        "bytes are pointers, meaningless on another rank")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (got strides {arr.strides})")
    if writable and not getattr(arr.flags, "writeable", True):  # CuPy has no such flag
        raise ValueError(f"{what} is read-only; the result cannot be written into it")


def check_pair(sendbuf, recvbuf, op: Op | None = None, same_size: bool = False) -> None:
    """recvbuf writable; sendbuf (unless IN_PLACE, None here) of its dtype and module, apart."""
    check_buffer(recvbuf, "recvbuf", writable=True)
    if sendbuf is not None:
        check_buffer(sendbuf, "sendbuf")
        if sendbuf.dtype != recvbuf.dtype:
            raise TypeError(f"sendbuf is {sendbuf.dtype}, recvbuf is {recvbuf.dtype}: "
                            "they must have the same dtype")
        xp = array_module(recvbuf)
        if array_module(sendbuf) is not xp:
            raise TypeError("sendbuf and recvbuf must both be host (NumPy) or device (CuPy) "
                            "arrays")
        if same_size and sendbuf.size != recvbuf.size:
            raise ValueError(f"sendbuf has {sendbuf.size} items, recvbuf {recvbuf.size}")
        if xp.may_share_memory(sendbuf, recvbuf) and xp.shares_memory(sendbuf, recvbuf):
            raise ValueError("sendbuf and recvbuf overlap; pass sendbuf=IN_PLACE instead")
    if op is not None:
        op.check(recvbuf.dtype)


def agree(comm, collective: str, tag: int, **call) -> None:
    """Raise ValueError on every rank unless all ranks describe the call alike.

    Each rank's description (``name=value`` for each keyword) is hashed; the ranks
    all-gather the digests with `tag`. Only if they differ are the descriptions
    themselves gathered, whatever their length, for the message.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    text = ", ".join(f"{key}={value}" for key, value in call.items()).encode()
    digest = hashlib.sha256(text).digest() + len(text).to_bytes(8, "little")  # 40 bytes
    table = np.zeros((n, len(digest)), dtype=np.uint8)
    table[rank] = np.frombuffer(digest, dtype=np.uint8)
    run(comm, ring_allgather(comm, table.reshape(-1), Blocks.equal(len(digest), n)), tag)
    if (table == table[0]).all():
        return
    lengths = [int.from_bytes(bytes(row[32:]), "little") for row in table]
    texts = np.zeros(sum(lengths), dtype=np.uint8)
    blocks = Blocks(lengths)
    blocks.view(texts, rank)[...] = np.frombuffer(text, dtype=np.uint8)
    run(comm, ring_allgather(comm, texts, blocks), tag)
    listing = "\n".join(f"  rank {r}: {bytes(blocks.view(texts, r)).decode(errors='replace')}"
                        for r in range(n))
    raise ValueError(f"{collective}: ranks disagree on the arguments:\n{listing}")
