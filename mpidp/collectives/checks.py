"""Argument checks, made once at a collective's entry, before any message.

Local checks (`check_buffer`, `check_pair`) raise on the rank that got the bad
argument: ``TypeError`` for a wrong kind of buffer or dtype, ``ValueError`` for
wrong sizes. No buffer of Python objects is ever sent: its bytes are pointers.

Ranks that disagree (count, dtype, op, root, algorithm) make an erroneous
program, which MPI libraries do not detect. mpidp guards against it twice:

- always: a signature of the call is folded into its tags (`state.signature`),
  so mismatched calls cannot exchange data; they stall until a deadline ends
  them, instead of returning a wrong answer;
- with ``MPIDP_DEBUG=1`` (or true, yes, on; `mpidp.config`) in the environment (or
  ``debug=True`` per call or per
  `mpidp.Comm`), `agree` first compares every rank's description of the call,
  in full, and every rank raises the same ``ValueError`` naming each rank's
  values. It costs one small all-gather per collective (two where they differ).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Mapping

import numpy as np

from ..arrays import array_module
from ..config import debug_enabled, set_debug  # noqa: F401 (the switch of `agree`)
from .algorithms import ALGORITHMS
from .algorithms.blocks import Blocks
from .algorithms.ops import Op
from .algorithms.ring import ring_allgather
from .bounded import Bounded
from .engine.driver import run


def check_algorithm(collective: str, algorithm) -> tuple:
    """Raise ValueError unless `algorithm` names one of `collective`'s; return the names."""
    names = ALGORITHMS.get(collective)
    if names is None:
        raise ValueError(f"unknown collective {collective!r}; expected one of {list(ALGORITHMS)}")
    if algorithm not in names:
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; expected one of {names}")
    return names


def check_algorithms(algorithm) -> None:
    """`mpidp.Comm`'s `algorithm`: ValueError for a name (or dict entry) that mpidp.ALGORITHMS
    does not list, TypeError for neither a name nor a dict."""
    if isinstance(algorithm, str):
        names = sorted({name for names in ALGORITHMS.values() for name in names})
        if algorithm not in names:
            raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {names}, "
                             f"or a dict {{collective: name}} (see mpidp.ALGORITHMS)")
    elif isinstance(algorithm, Mapping):
        for collective, name in algorithm.items():
            check_algorithm(collective, name)
    else:
        raise TypeError(f"algorithm must be a name or a dict, not {type(algorithm).__name__}")


def index(value, what: str) -> int:
    """An integer argument (a root) as the int it is: ``np.int64(1)`` is 1, as in MPI, so
    that every rank signs and describes it alike; TypeError naming it if it is no integer
    (``root=1.0``), before any message."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what}={value!r}: expected an integer, not "
                        f"{type(value).__name__}") from None


def indices(values, what: str) -> tuple[int, ...]:
    """Integer arguments (counts, displacements) as a tuple of ints; TypeError naming them."""
    try:
        return tuple(map(operator.index, values))
    except TypeError:
        raise TypeError(f"{what}={values!r}: expected a sequence of integers") from None


def check_buffer(arr, what: str, writable: bool = False) -> None:
    """Raise unless `arr` is a contiguous NumPy/CuPy array of plain data (writable if asked)."""
    _check_kind(arr, what)
    _check_layout(arr, what, writable)


def _check_kind(arr, what: str) -> None:
    """What depends on the array's type and dtype only."""
    if not hasattr(arr, "dtype") or not hasattr(arr, "flags"):
        raise TypeError(f"{what} must be a NumPy or CuPy array, not {type(arr).__name__}")
    if arr.dtype.hasobject:
        raise TypeError(f"{what} has dtype {arr.dtype}, which holds Python objects: their "
                        "bytes are pointers, meaningless on another rank")


def _check_layout(arr, what: str, writable: bool = False) -> None:
    """What depends on the array object itself: its memory layout and writability."""
    flags = arr.flags
    if not flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (got strides {arr.strides})")
    if writable and not getattr(flags, "writeable", True):  # CuPy has no such flag
        raise ValueError(f"{what} is read-only; the result cannot be written into it")


def check_pair(sendbuf, recvbuf, op: Op | None = None, same_size: bool = False) -> None:
    """recvbuf writable; sendbuf (unless IN_PLACE, None here) of its dtype and module, apart.

    What depends only on the kinds of the arguments (array types, dtypes, the op's
    kinds) is checked once per combination and remembered; what depends on the
    arrays themselves (layout, writability, sizes, overlap) at every call.
    """
    try:
        kinds = (type(sendbuf), sendbuf is not None and sendbuf.dtype, type(recvbuf),
                 recvbuf.dtype, op and op.kinds)
    except AttributeError:  # not an array: the full check says what is wrong
        kinds = None
    if kinds is None or kinds not in _checked_kinds:
        _check_kinds(sendbuf, recvbuf, op)
        _checked_kinds.remember(kinds, True)
    flags = recvbuf.flags  # (the layout checks inlined where they pass: every call's path)
    if not (flags.c_contiguous and getattr(flags, "writeable", True)):
        _check_layout(recvbuf, "recvbuf", writable=True)  # raises, saying what is wrong
    if sendbuf is not None:
        if not sendbuf.flags.c_contiguous:
            _check_layout(sendbuf, "sendbuf")
        if same_size and sendbuf.size != recvbuf.size:
            raise ValueError(f"sendbuf has {sendbuf.size} items, recvbuf {recvbuf.size}")
        xp = np if type(recvbuf) is np.ndarray else array_module(recvbuf)
        if xp.may_share_memory(sendbuf, recvbuf) and xp.shares_memory(sendbuf, recvbuf):
            raise ValueError("sendbuf and recvbuf overlap; pass sendbuf=IN_PLACE instead")


# (send type, send dtype, recv type, recv dtype, op kinds) found fine
_checked_kinds = Bounded(limit=1024)


def _check_kinds(sendbuf, recvbuf, op: Op | None) -> None:
    _check_kind(recvbuf, "recvbuf")
    if sendbuf is not None:
        _check_kind(sendbuf, "sendbuf")
        if sendbuf.dtype != recvbuf.dtype:
            raise TypeError(f"sendbuf is {sendbuf.dtype}, recvbuf is {recvbuf.dtype}: "
                            "they must have the same dtype")
        if array_module(sendbuf) is not array_module(recvbuf):
            raise TypeError("sendbuf and recvbuf must both be host (NumPy) or device (CuPy) "
                            "arrays")
    if op is not None:
        op.check(recvbuf.dtype)


def scatter_blocks(total: int, recv_size: int, recvcounts, in_place: bool, n: int,
                   rank: int) -> Blocks:
    """A reduce-scatter's blocks: `recvcounts` (None: equal blocks), checked against the
    vector's `total` items (sendbuf's, in place recvbuf's) and this rank's recvbuf."""
    if recvcounts is None:
        if in_place and total % n:
            raise ValueError(f"in-place reduce_scatter_block: recvbuf size {total} "
                             f"is not a multiple of the {n} ranks")
        blocks = Blocks.equal(total // n if in_place else recv_size, n)
    elif len(recvcounts) != n:
        raise ValueError(f"recvcounts has {len(recvcounts)} entries for {n} ranks")
    else:
        blocks = Blocks(recvcounts)
    if total != blocks.total:
        raise ValueError(f"{'recvbuf' if in_place else 'sendbuf'} has {total} items, "
                         f"the recvcounts add up to {blocks.total}")
    if recv_size < blocks.counts[rank]:
        raise ValueError(f"recvbuf has {recv_size} items, rank {rank} receives "
                         f"{blocks.counts[rank]}")
    return blocks


def gather_blocks(send_size: int | None, recv_size: int, recvcounts, displs, n: int,
                  rank: int) -> Blocks:
    """An all-gather's blocks: `recvcounts` and `displs` (None: equal, packed), checked
    against this rank's buffers (`send_size` None: in place)."""
    in_place = send_size is None
    if recvcounts is None:
        if in_place and recv_size % n:
            raise ValueError(f"in-place allgather: recvbuf size {recv_size} "
                             f"is not a multiple of the {n} ranks")
        recvcounts = Blocks.equal(recv_size // n if in_place else send_size, n).counts
    if len(recvcounts) != n or (displs is not None and len(displs) != n):
        raise ValueError(f"need one recvcount (and displ) per rank, {n} ranks")
    if displs is None and len(set(recvcounts)) == 1:
        blocks = Blocks.equal(recvcounts[0], n)  # cached: the common MPI_Allgather case
    else:
        blocks = Blocks(recvcounts, displs)
    if recv_size < blocks.extent:
        raise ValueError(f"recvbuf has {recv_size} items, the blocks need {blocks.extent}")
    if not in_place and send_size != blocks.counts[rank]:
        raise ValueError(f"sendbuf has {send_size} items, recvcounts[{rank}] is "
                         f"{blocks.counts[rank]}")
    return blocks


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


def agree_total(comm, collective: str, tag: int, mine: int, total: int) -> None:
    """Raise ValueError on every rank unless the ranks' `mine` add up to `total`.

    For the exact sums of parts (``addends``): each rank all-gathers the number of parts
    it holds with `tag` (8 bytes a rank), and every rank names each rank's count.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    held = np.zeros(n, dtype=np.int64)
    held[rank] = mine
    run(comm, ring_allgather(comm, held, Blocks.equal(1, n)), tag)
    if int(held.sum()) != total:
        raise ValueError(f"{collective}: the ranks hold {int(held.sum())} parts in all "
                         f"({', '.join(f'rank {r}: {c}' for r, c in enumerate(held.tolist()))}), "
                         f"but addends={total}")
