"""Entry points: check the arguments once, set up buffers, pick the algorithm, run it.

Every collective has a nonblocking form (``iallreduce`` ... returns a `Request`)
and a blocking one (``allreduce`` ... = start, then wait). Arguments are NumPy
or CuPy arrays; ``sendbuf=IN_PLACE`` means the input is in ``recvbuf``, as in
MPI. All checks happen here (`checks`), before any message is sent, on the rank
that got the bad argument.

Any number of nonblocking collectives may be in flight on one communicator,
completed in any order: each takes the next tag of its communicator's sequence
(`state`), as MPI matches collectives by the order of the calls. ``tag=`` gives
a tag of your own instead (below ``TAG_BASE``; then the concurrency is yours to
manage). Ranks that disagree on the arguments cannot exchange data (the call's
signature is in its tags); ``MPIDP_DEBUG=1`` or ``debug=True`` makes every rank
raise ``ValueError`` with what each rank passed (`checks.agree`).
"""

from __future__ import annotations

from mpi4py import MPI

from . import cost
from .blocks import Blocks
from .buffers import array_module
from .checks import check_buffer, check_pair
from .direct import direct_allreduce, direct_scratch
from .halving import (
    halving_scratch,
    rabenseifner_allreduce,
    rabenseifner_article_allreduce,
    rabenseifner_scratch,
    recursive_doubling_allgather,
    recursive_doubling_allreduce,
    recursive_halving_reduce_scatter,
)
from .hierarchical import hierarchical_allreduce
from .ops import resolve_op
from .plan import Call, Plan, copy_rounds, no_rounds, planned
from .ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from .schedule import Request
from .state import TAG_BASE  # noqa: F401 (mpidp.TAG_BASE)
from .topology import placement
from .tree import binomial_bcast, naive_allreduce, scatter_allgather_bcast

IN_PLACE = MPI.IN_PLACE

# name -> (generator, scratch items needed for a vector of `blocks`, one block per rank).
# The all-reduce and reduce-scatter generators take (comm, buf, blocks, op, tmp, src):
# out of place, `src` is sendbuf, read and never written, and `buf` receives the results.
ALLREDUCE = {
    "ring": (ring_allreduce, lambda blocks: blocks.max),
    "rabenseifner": (rabenseifner_allreduce, rabenseifner_scratch),
    "recursive_doubling": (recursive_doubling_allreduce, lambda blocks: blocks.total),
    "naive": (naive_allreduce, lambda blocks: blocks.total),
    "direct": (direct_allreduce, direct_scratch),
    "rabenseifner_article": (rabenseifner_article_allreduce, rabenseifner_scratch),
    "hierarchical": (hierarchical_allreduce, lambda blocks: blocks.total),
}
REDUCE_SCATTER = {
    "ring": (ring_reduce_scatter, lambda blocks: blocks.max),
    "recursive_halving": (recursive_halving_reduce_scatter,
                          lambda blocks: halving_scratch(blocks, len(blocks))),
}
ALLGATHER = {"ring": ring_allgather, "recursive_doubling": recursive_doubling_allgather}
BCAST = {"binomial": binomial_bcast, "scatter_allgather": scatter_allgather_bcast}

# per collective, the algorithms whose messages depend on where the ranks run: planning one
# learns the placement (once per communicator, `topology.placement`: a query, collective
# like auto's calibration), after the call's tag, so that MPIDP_DEBUG's agreement check
# comes first
PLACED = {"allreduce": ("rabenseifner", "hierarchical"),
          "reduce_scatter": ("recursive_halving",), "allgather": ("recursive_doubling",)}

ALGORITHMS = {
    "allreduce": (*ALLREDUCE, "auto"),
    "reduce_scatter": (*REDUCE_SCATTER, "auto"),
    "allgather": (*ALLGATHER, "auto"),
    "bcast": (*BCAST, "auto"),
}


def check_algorithm(collective: str, algorithm) -> tuple:
    """Raise ValueError unless `algorithm` names one of `collective`'s; return the names."""
    names = ALGORITHMS.get(collective)
    if names is None:
        raise ValueError(f"unknown collective {collective!r}; expected one of {list(ALGORITHMS)}")
    if algorithm not in names:
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; expected one of {names}")
    return names


def choose(comm, collective: str, nbytes: int, algorithm: str) -> str:
    """Resolve ``"auto"`` to an algorithm name; check a given name.

    ``"auto"`` takes the algorithm with the least predicted time (`cost.predict`).
    The choice depends only on (nbytes, N) and the comm's model, which every rank
    holds alike, so every rank makes it alike; the first ``"auto"`` on a comm
    calibrates the model, collectively (see `cost.model`).
    """
    names = check_algorithm(collective, algorithm)
    if algorithm != "auto":
        return algorithm
    if comm.Get_size() == 1:
        return names[0]
    return cost.choose(comm, collective, names[:-1], nbytes)


@planned
def plan_allreduce(call: Call, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto") -> Plan:
    """Check the arguments of an all-reduce and set it up (``sendbuf=IN_PLACE``: in recvbuf)."""
    comm = call.comm
    op = resolve_op(op)
    check_pair(None if sendbuf is IN_PLACE else sendbuf, recvbuf, op, same_size=True)
    buf = recvbuf.reshape(-1)
    algorithm = choose(comm, "allreduce", buf.nbytes, algorithm)
    tag = call.tag("allreduce", buf.size, buf.dtype, op, algorithm)
    if algorithm in PLACED["allreduce"]:
        placement(comm)
    n = comm.Get_size()
    if sendbuf is not IN_PLACE and n == 1:  # one rank: no round will write recvbuf
        return Plan(call, copy_rounds, (buf, sendbuf.reshape(-1)), tag)
    if buf.size == 0:
        return Plan(call, no_rounds, (), tag)
    # out of place, the algorithms read sendbuf where it is (no copy first)
    src = None if sendbuf is IN_PLACE else sendbuf.reshape(-1)
    blocks = Blocks.even(buf.size, n)
    algo, scratch_items = ALLREDUCE[algorithm]
    tmp = call.state.pool.take(buf, scratch_items(blocks))
    return Plan(call, algo, (comm, buf, blocks, op, tmp, src), tag, None, (tmp,), buf)


@planned
def plan_reduce_scatter(call: Call, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                        algorithm: str = "auto") -> Plan:
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
    comm = call.comm
    op = resolve_op(op)
    n, rank = comm.Get_size(), comm.Get_rank()
    in_place = sendbuf is IN_PLACE
    check_pair(None if in_place else sendbuf, recvbuf, op)
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
    tag = call.tag("reduce_scatter", blocks.counts, full.dtype, op, algorithm)
    if algorithm in PLACED["reduce_scatter"]:
        placement(comm)
    out = recvbuf.reshape(-1)[: blocks.counts[rank]]
    if in_place and n == 1:  # the vector is its own result, where it is
        return Plan(call, no_rounds, (), tag)
    pool = call.state.pool
    work = pool.take(full, full.size)  # the partial sums: a pooled vector, reused across calls
    algo, scratch_items = REDUCE_SCATTER[algorithm]
    tmp = pool.take(work, scratch_items(blocks))
    # the input is read where it is: the algorithms never write it (one rank: a copy)
    args = (comm, work, blocks, op, tmp, full.reshape(-1) if n > 1 else None)
    if n == 1:
        algo, args = copy_rounds, (work, full.reshape(-1), algo, *args)

    def finish():
        out[...] = blocks.view(work, rank)  # in place: to the front, the rest untouched

    return Plan(call, algo, args, tag, finish, (tmp, work), work)


@planned
def plan_allgather(call: Call, sendbuf, recvbuf, recvcounts=None, displs=None,
                   algorithm: str = "auto") -> Plan:
    """Check and set up an all-gather: block r of `recvbuf` gets rank r's `sendbuf`.

    Args:
        recvcounts, displs: per-rank counts and offsets (``MPI_Allgatherv``); None
            means equal blocks of ``sendbuf.size`` items, packed (with IN_PLACE,
            ``recvbuf.size / N``), as ``MPI_Allgather``. The displacements are this
            rank's layout of recvbuf; the counts must be the same on every rank.
        sendbuf: this rank's block, or IN_PLACE: it is already at its place in recvbuf.
    """
    comm = call.comm
    n, rank = comm.Get_size(), comm.Get_rank()
    in_place = sendbuf is IN_PLACE
    check_pair(None if in_place else sendbuf, recvbuf)
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
    tag = call.tag("allgather", blocks.counts, buf.dtype, None, algorithm)
    if algorithm in PLACED["allgather"]:
        placement(comm)
    algo, args = ALLGATHER[algorithm], (comm, buf, blocks)
    if not in_place:  # this rank's block to its place in recvbuf, at every run
        algo, args = copy_rounds, (blocks.view(buf, rank), sendbuf.reshape(-1), algo, *args)
    return Plan(call, algo, args, tag, None, (), buf)


@planned
def plan_bcast(call: Call, buf, root: int = 0, algorithm: str = "auto") -> Plan:
    """Check and set up a broadcast of `buf` from `root` to every rank."""
    comm = call.comm
    n = comm.Get_size()
    check_buffer(buf, "buf", writable=comm.Get_rank() != root)
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not a rank of a communicator of size {n}")
    flat = buf.reshape(-1)
    algorithm = choose(comm, "bcast", flat.nbytes, algorithm)
    tag = call.tag("bcast", flat.size, flat.dtype, None, algorithm, root)
    algo, args = BCAST[algorithm], (comm, flat, root)
    if algorithm == "scatter_allgather" and not getattr(flat.flags, "writeable", True):
        # a read-only root buffer (MPI allows it): the ring writes the root's blocks
        # back, so it runs on a copy, made at every run
        flat = array_module(flat).empty_like(flat)
        algo, args = copy_rounds, (flat, args[1], algo, comm, flat, root)
    return Plan(call, algo, args, tag, None, (), flat)


def allreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", **kw) -> None:
    """All-reduce: every rank's `recvbuf` gets the reduction of all ranks' `sendbuf`.

    Keywords: ``tag`` (your own, below ``TAG_BASE``), ``debug`` (check that ranks agree).
    """
    plan_allreduce(comm, sendbuf, recvbuf, op, algorithm, **kw).run()


def iallreduce(comm, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto", **kw) -> Request:
    """Start an all-reduce; returns a Request (`test()`, `wait()`)."""
    return plan_allreduce(comm, sendbuf, recvbuf, op, algorithm, **kw).start()


def reduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                   algorithm: str = "auto", **kw) -> None:
    """Reduce-scatter; see `plan_reduce_scatter`."""
    plan_reduce_scatter(comm, sendbuf, recvbuf, recvcounts, op, algorithm, **kw).run()


def ireduce_scatter(comm, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM,
                    algorithm: str = "auto", **kw) -> Request:
    """Start a reduce-scatter; returns a Request."""
    return plan_reduce_scatter(comm, sendbuf, recvbuf, recvcounts, op, algorithm, **kw).start()


def allgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
              algorithm: str = "auto", **kw) -> None:
    """All-gather; see `plan_allgather`."""
    plan_allgather(comm, sendbuf, recvbuf, recvcounts, displs, algorithm, **kw).run()


def iallgather(comm, sendbuf, recvbuf, recvcounts=None, displs=None,
               algorithm: str = "auto", **kw) -> Request:
    """Start an all-gather; returns a Request."""
    return plan_allgather(comm, sendbuf, recvbuf, recvcounts, displs, algorithm, **kw).start()


def bcast(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> None:
    """Broadcast `buf` from `root`."""
    plan_bcast(comm, buf, root, algorithm, **kw).run()


def ibcast(comm, buf, root: int = 0, algorithm: str = "auto", **kw) -> Request:
    """Start a broadcast; returns a Request."""
    return plan_bcast(comm, buf, root, algorithm, **kw).start()
