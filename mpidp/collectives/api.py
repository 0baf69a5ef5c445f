"""Entry points: check the arguments once, set up buffers, pick the algorithm, run it.

Every collective has a nonblocking form (``iallreduce`` ... returns a `Handle`)
and a blocking one (``allreduce`` ... = start, then wait). Arguments are NumPy
or CuPy arrays; ``sendbuf=IN_PLACE`` means the input is in ``recvbuf``, as in
MPI. All checks happen here, before any message is sent, on the rank that got
the bad argument.

Ranks that disagree on the count (or dtype, op, algorithm, root) make an
erroneous program, as in MPI: without ``debug`` the result is an MPI truncation
error on some rank or a hang. With ``debug=True`` every rank first gathers the
others' arguments (one small all-gather) and all of them raise ``ValueError``
with the table of what each rank passed.

Concurrent nonblocking collectives on one communicator need distinct tags
(`mpidp.Comm` numbers them for you); mpidp's messages use tags from
``TAG_BASE`` up, so keep your own point-to-point tags below it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from . import cost
from .blocks import Blocks
from .buffers import ScratchPool, array_module, check_buffer, staging_mode, sync
from .halving import (
    halving_scratch,
    rabenseifner_allreduce,
    rabenseifner_scratch,
    recursive_doubling_allgather,
    recursive_doubling_allreduce,
    recursive_halving_reduce_scatter,
)
from .ops import Op, resolve_op
from .ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from .schedule import Handle, run
from .tree import binomial_bcast, naive_allreduce, scatter_allgather_bcast

IN_PLACE = MPI.IN_PLACE
TAG_BASE = 0x4D50  # 19792; tags TAG_BASE .. TAG_BASE + TAG_SPAN - 1 are mpidp's
TAG_SPAN = 4096
DEFAULT_TAG = TAG_BASE

POOL = ScratchPool()  # scratch shared by calls that pass no pool of their own

CALIBRATION_TAG = TAG_BASE + TAG_SPAN  # cost.calibrate's messages, apart from any collective's

# name -> (generator, scratch items needed for a vector of `blocks`, one block per rank).
# The all-reduce and reduce-scatter generators take (comm, buf, blocks, op, tmp, src):
# out of place, `src` is sendbuf, read and never written, and `buf` receives the results.
ALLREDUCE = {
    "ring": (ring_allreduce, lambda blocks: blocks.max),
    "rabenseifner": (rabenseifner_allreduce, rabenseifner_scratch),
    "recursive_doubling": (recursive_doubling_allreduce, lambda blocks: blocks.total),
    "naive": (naive_allreduce, lambda blocks: blocks.total),
}
REDUCE_SCATTER = {
    "ring": (ring_reduce_scatter, lambda blocks: blocks.max),
    "recursive_halving": (recursive_halving_reduce_scatter,
                          lambda blocks: halving_scratch(blocks, len(blocks))),
}
ALLGATHER = {"ring": ring_allgather, "recursive_doubling": recursive_doubling_allgather}
BCAST = {"binomial": binomial_bcast, "scatter_allgather": scatter_allgather_bcast}

ALGORITHMS = {
    "allreduce": (*ALLREDUCE, "auto"),
    "reduce_scatter": (*REDUCE_SCATTER, "auto"),
    "allgather": (*ALLGATHER, "auto"),
    "bcast": (*BCAST, "auto"),
}


def choose(comm, collective: str, nbytes: int, algorithm: str) -> str:
    """Resolve ``"auto"`` to an algorithm name; check a given name.

    ``"auto"`` takes the algorithm with the least predicted time (`cost.predict`).
    The choice depends only on (nbytes, N) and the comm's model, which every rank
    holds alike, so every rank makes it alike; the first ``"auto"`` on a comm
    calibrates the model, collectively (see `cost.model`).
    """
    names = ALGORITHMS[collective]
    if algorithm not in names:
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; expected one of {names}")
    if algorithm != "auto":
        return algorithm
    n = comm.Get_size()
    if n == 1:
        return names[0]
    return cost.choose(comm, CALIBRATION_TAG, collective, names[:-1], nbytes)


class Plan(NamedTuple):
    """A collective ready to run: its rounds, and what to do when they are done."""

    comm: object
    rounds: object
    tag: int
    on_done: object = None
    mode: str | None = None  # staging mode; "host": NumPy buffers, nothing to stage

    def start(self) -> Handle:
        return Handle(self.comm, self.rounds, self.tag, self.on_done, self.mode)

    def run(self) -> None:
        run(self.comm, self.rounds, self.tag, self.on_done, self.mode)


def _mode(buf) -> str:
    """The staging mode for a collective on `buf`, decided once per call."""
    mode = staging_mode()
    return "host" if mode == "auto" and type(buf) is np.ndarray else mode


def plan_allreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", *,
                   tag: int = DEFAULT_TAG, pool: ScratchPool | None = None,
                   debug: bool = False) -> Plan:
    """Check the arguments of an all-reduce and set it up (``sendbuf=IN_PLACE``: in recvbuf)."""
    op = resolve_op(op)
    _check_pair(sendbuf, recvbuf, op, same_size=True)
    buf = recvbuf.reshape(-1)
    algorithm = choose(comm, "allreduce", buf.nbytes, algorithm)
    if debug:
        _agree(comm, "allreduce", tag, buf.size, buf.dtype, op, algorithm)
    n = comm.Get_size()
    src = None  # out of place, the algorithms read sendbuf where it is (no copy first)
    if sendbuf is not IN_PLACE:
        if n > 1:
            src = sendbuf.reshape(-1)
        else:  # one rank: no round will write recvbuf
            array_module(buf).copyto(buf, sendbuf.reshape(-1))
    if buf.size == 0:
        return Plan(comm, iter(()), tag)
    blocks = Blocks.even(buf.size, n)
    algo, scratch_items = ALLREDUCE[algorithm]
    pool = POOL if pool is None else pool
    tmp = pool.take(buf, scratch_items(blocks))
    sync(buf)
    return Plan(comm, algo(comm, buf, blocks, op, tmp, src), tag, lambda: pool.give(tmp),
                _mode(buf))


def plan_reduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                        algorithm: str = "auto", *, tag: int = DEFAULT_TAG,
                        pool: ScratchPool | None = None, debug: bool = False) -> Plan:
    """Check and set up a reduce-scatter: rank r gets block r of the reduced vector.

    Args:
        recvcounts: items each rank gets (``MPI_Reduce_scatter``); None means equal
            blocks of ``recvbuf.size`` items (``MPI_Reduce_scatter_block``; with
            IN_PLACE, ``recvbuf.size / N``).
        sendbuf: the whole vector, or IN_PLACE: the vector is in recvbuf, and the
            result is written to its start, as in MPI. The partial sums go to a
            pooled work vector, and the input is read where it is, not copied:
            MPI forbids writing sendbuf, and in place the rest of recvbuf, past
            this rank's block, keeps what it held (as MPICH and Open MPI mostly
            leave it, and programs rely on; docs/dropin.md).
    """
    op = resolve_op(op)
    n, rank = comm.Get_size(), comm.Get_rank()
    in_place = sendbuf is IN_PLACE
    _check_pair(sendbuf, recvbuf, op, same_size=False)
    full = recvbuf if in_place else sendbuf
    if recvcounts is None:
        if in_place and full.size % n:
            raise ValueError(f"in-place reduce_scatter_block: recvbuf size {full.size} "
                             f"is not a multiple of the {n} ranks")
        blocks = Blocks.equal(full.size // n if in_place else recvbuf.size, n)
    elif len(recvcounts) != n:
        raise ValueError(f"recvcounts has {len(recvcounts)} entries for {n} ranks")
    else:
        blocks = Blocks(recvcounts)
    if full.size != blocks.total:
        raise ValueError(f"{'recvbuf' if in_place else 'sendbuf'} has {full.size} items, "
                         f"the recvcounts add up to {blocks.total}")
    if recvbuf.size < blocks.counts[rank]:
        raise ValueError(f"recvbuf has {recvbuf.size} items, rank {rank} receives "
                         f"{blocks.counts[rank]}")
    algorithm = choose(comm, "reduce_scatter", full.nbytes, algorithm)
    if debug:
        _agree(comm, "reduce_scatter", tag, blocks.counts, full.dtype, op, algorithm)
    if in_place and n == 1:  # the vector is its own result, where it is
        return Plan(comm, iter(()), tag)
    pool = POOL if pool is None else pool
    out = recvbuf.reshape(-1)[: blocks.counts[rank]]
    work = pool.take(full, full.size)  # the partial sums: a pooled vector, reused across calls
    src = None
    if n > 1:
        src = full.reshape(-1)  # read where it is: the algorithms never write it
    else:
        array_module(work).copyto(work, full.reshape(-1))
    algo, scratch_items = REDUCE_SCATTER[algorithm]
    tmp = pool.take(work, scratch_items(blocks))

    def done():
        out[...] = blocks.view(work, rank)  # in place: to the front, the rest untouched
        pool.give(tmp)
        pool.give(work)

    sync(work)
    return Plan(comm, algo(comm, work, blocks, op, tmp, src), tag, done, _mode(work))


def plan_allgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
                   algorithm: str = "auto", *, tag: int = DEFAULT_TAG,
                   debug: bool = False) -> Plan:
    """Check and set up an all-gather: block r of `recvbuf` gets rank r's `sendbuf`.

    Args:
        recvcounts, displs: per-rank counts and offsets (``MPI_Allgatherv``); None
            means equal blocks of ``sendbuf.size`` items, packed (with IN_PLACE,
            ``recvbuf.size / N``), as ``MPI_Allgather``.
        sendbuf: this rank's block, or IN_PLACE: it is already at its place in recvbuf.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    in_place = sendbuf is IN_PLACE
    check_buffer(recvbuf, "recvbuf", writable=True)
    if not in_place:
        check_buffer(sendbuf, "sendbuf")
        _check_dtypes(sendbuf, recvbuf)
        _check_no_alias(sendbuf, recvbuf)
    if recvcounts is None:
        if in_place and recvbuf.size % n:
            raise ValueError(f"in-place allgather: recvbuf size {recvbuf.size} "
                             f"is not a multiple of the {n} ranks")
        recvcounts = Blocks.equal(recvbuf.size // n if in_place else sendbuf.size, n).counts
    if len(recvcounts) != n or (displs is not None and len(displs) != n):
        raise ValueError(f"need one recvcount (and displ) per rank, {n} ranks")
    if displs is None and len(set(recvcounts)) == 1:
        blocks = Blocks.equal(recvcounts[0], n)  # cached: the common MPI_Allgather case
    else:
        blocks = Blocks(recvcounts, displs)
    if recvbuf.size < blocks.extent:
        raise ValueError(f"recvbuf has {recvbuf.size} items, the blocks need {blocks.extent}")
    if not in_place and sendbuf.size != blocks.counts[rank]:
        raise ValueError(f"sendbuf has {sendbuf.size} items, recvcounts[{rank}] is "
                         f"{blocks.counts[rank]}")
    buf = recvbuf.reshape(-1)
    # choose on the blocks' size, which every rank computes alike (recvbuf may be larger)
    algorithm = choose(comm, "allgather", blocks.total * buf.itemsize, algorithm)
    if debug:
        _agree(comm, "allgather", tag, blocks.counts, blocks.displs, buf.dtype, algorithm)
    if not in_place:
        array_module(buf).copyto(blocks.view(buf, rank), sendbuf.reshape(-1))
    sync(buf)
    return Plan(comm, ALLGATHER[algorithm](comm, buf, blocks), tag, None, _mode(buf))


def plan_bcast(comm, buf, root: int = 0, algorithm: str = "auto", *,
               tag: int = DEFAULT_TAG, debug: bool = False) -> Plan:
    """Check and set up a broadcast of `buf` from `root` to every rank."""
    n = comm.Get_size()
    check_buffer(buf, "buf", writable=comm.Get_rank() != root)
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not a rank of a communicator of size {n}")
    flat = buf.reshape(-1)
    algorithm = choose(comm, "bcast", flat.nbytes, algorithm)
    if debug:
        _agree(comm, "bcast", tag, flat.size, flat.dtype, algorithm, root)
    if algorithm == "scatter_allgather" and not getattr(flat.flags, "writeable", True):
        flat = flat.copy()  # root's read-only buf (MPI allows it): the ring writes it back
    sync(flat)
    return Plan(comm, BCAST[algorithm](comm, flat, root), tag, None, _mode(flat))


def allreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", **kw) -> None:
    """All-reduce: every rank's `recvbuf` gets the reduction of all ranks' `sendbuf`.

    Keywords: ``tag``, ``pool`` (a ScratchPool), ``debug`` (check that ranks agree).
    """
    plan_allreduce(comm, sendbuf, recvbuf, op, algorithm, **kw).run()


def iallreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", **kw) -> Handle:
    """Start an all-reduce; returns a Handle (`test()`, `wait()`)."""
    return plan_allreduce(comm, sendbuf, recvbuf, op, algorithm, **kw).start()


def reduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                   algorithm: str = "auto", **kw) -> None:
    """Reduce-scatter; see `plan_reduce_scatter`."""
    plan_reduce_scatter(comm, sendbuf, recvbuf, recvcounts, op, algorithm, **kw).run()


def ireduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                    algorithm: str = "auto", **kw) -> Handle:
    """Start a reduce-scatter; returns a Handle."""
    return plan_reduce_scatter(comm, sendbuf, recvbuf, recvcounts, op, algorithm, **kw).start()


def allgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
              algorithm: str = "auto", **kw) -> None:
    """All-gather; see `plan_allgather`."""
    plan_allgather(comm, sendbuf, recvbuf, recvcounts, displs, algorithm, **kw).run()


def iallgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
               algorithm: str = "auto", **kw) -> Handle:
    """Start an all-gather; returns a Handle."""
    return plan_allgather(comm, sendbuf, recvbuf, recvcounts, displs, algorithm, **kw).start()


def bcast(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> None:
    """Broadcast `buf` from `root`."""
    plan_bcast(comm, buf, root, algorithm, **kw).run()


def ibcast(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> Handle:
    """Start a broadcast; returns a Handle."""
    return plan_bcast(comm, buf, root, algorithm, **kw).start()


# ---------------------------------------------------------------- helpers

def _check_pair(sendbuf, recvbuf, op: Op, same_size: bool) -> None:
    check_buffer(recvbuf, "recvbuf", writable=True)
    if sendbuf is not IN_PLACE:
        check_buffer(sendbuf, "sendbuf")
        _check_dtypes(sendbuf, recvbuf)
        if same_size and sendbuf.size != recvbuf.size:
            raise ValueError(f"sendbuf has {sendbuf.size} items, recvbuf {recvbuf.size}")
        _check_no_alias(sendbuf, recvbuf)
    op.check(recvbuf.dtype)


def _check_dtypes(sendbuf, recvbuf) -> None:
    if sendbuf.dtype != recvbuf.dtype:
        raise TypeError(f"sendbuf is {sendbuf.dtype}, recvbuf is {recvbuf.dtype}: "
                        "they must have the same dtype")
    if array_module(sendbuf) is not array_module(recvbuf):
        raise TypeError("sendbuf and recvbuf must both be host (NumPy) or device (CuPy) arrays")


def _check_no_alias(sendbuf, recvbuf) -> None:
    xp = array_module(recvbuf)
    if xp.may_share_memory(sendbuf, recvbuf) and xp.shares_memory(sendbuf, recvbuf):
        raise ValueError("sendbuf and recvbuf overlap; pass sendbuf=IN_PLACE instead")


def _agree(comm, collective: str, tag: int, *args) -> None:
    """Debug mode: check that every rank passed the same arguments; raise on all if not."""
    width = 256
    mine = np.zeros(width, dtype=np.uint8)
    text = repr([str(a) for a in args]).encode()[:width]
    mine[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    n, rank = comm.Get_size(), comm.Get_rank()
    table = np.zeros(n * width, dtype=np.uint8)
    table[rank * width : (rank + 1) * width] = mine
    run(comm, ring_allgather(comm, table, Blocks([width] * n)), tag)
    rows = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in table.reshape(n, width)]
    if len(set(rows)) > 1:
        listing = "\n".join(f"  rank {r}: {row}" for r, row in enumerate(rows))
        raise ValueError(f"{collective}: ranks disagree on the arguments "
                         f"(count(s), dtype, op, algorithm, root):\n{listing}")
