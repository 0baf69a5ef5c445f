"""Each collective's plan: its arguments checked, its algorithm chosen, its buffers set up.

    plan_allreduce(call, sendbuf, recvbuf, op, algorithm)        -> Plan
    plan_reduce_scatter(call, sendbuf, recvbuf, recvcounts, op, algorithm)
    plan_allgather(call, sendbuf, recvbuf, recvcounts, displs, algorithm)
    plan_bcast(call, buf, root, algorithm)

Each takes the `plan.Call` that already holds the collective's number (`plan.planned`
makes it: the entry points in `api`, and `mpidp.Comm` through `dropin.parse`) and
returns the `plan.Plan` that runs it. All checks happen here (`checks`), before any
message is sent, on the rank that got the bad argument; with ``MPIDP_DEBUG`` the
ranks then compare the arguments as passed (`plan.Call.agree`) before anything
collective. What a signature determines (the algorithm ``auto`` picks, the blocks,
the scratch size) is worked out once per communicator (`plan.Call.setup`). The
exact sums (``op=EXACT_SUM``) are `exact`'s plans.
"""

from __future__ import annotations

from mpi4py import MPI

from ..arrays import array_module, flat
from . import exact
from .algorithms import entry
from .algorithms.blocks import Blocks
from .algorithms.ops import AVG, SUM
from .algorithms.ring import ring_reduce_scatter
from .algorithms.rounds import Rounds, copy_rounds, no_rounds
from .algorithms.tree import scatter_allgather_bcast
from .checks import (
    check_algorithm,
    check_buffer,
    check_pair,
    gather_blocks,
    index,
    indices,
    scatter_blocks,
)
from .cost import choose
from .mpiops import resolve_op
from .placement import locate
from .plan import Call, Plan, Setup, signed

IN_PLACE = MPI.IN_PLACE


def plan_allreduce(call: Call, sendbuf, recvbuf, op=MPI.SUM, algorithm: str = "auto") -> Plan:
    """Check the arguments of an all-reduce and set it up (``sendbuf=IN_PLACE``: in recvbuf)."""
    comm = call.comm
    op = resolve_op(op)
    send = None if sendbuf is IN_PLACE else sendbuf
    check_pair(send, recvbuf, op, same_size=True)
    buf = flat(recvbuf)
    if op.exact and buf.dtype.kind == "f":  # exact.py's passes (on integers SUM is exact)
        return exact.plan_exact(call, [buf if send is None else flat(send)], buf, op,
                                algorithm, comm.Get_size())
    op = SUM if op.exact else op
    if call.debug:  # the arguments as passed, before auto's (collective) set-up
        check_algorithm("allreduce", algorithm)
        call.agree("allreduce", count=buf.size, dtype=buf.dtype, op=op.name, algorithm=algorithm)
    s = call.setup(("allreduce", buf.size, buf.dtype, op.name, algorithm), _allreduce_setup,
                   comm, buf, op, algorithm)
    tag = call.tag(s.signed)
    algo = s.algo.bound(locate(comm, call.state, "allreduce", s.algo.name)) if s.algo.placed \
        else s.algo.rounds  # one that reads no placement needs no look-up (most)
    src = None if send is None else flat(send)
    if src is not None and comm.Get_size() == 1:  # one rank: no round will write recvbuf
        return Plan(call, copy_rounds, (buf, src), tag)
    if buf.size == 0:
        return Plan(call, no_rounds, (), tag)
    # out of place, the algorithms read sendbuf where it is (no copy first)
    if op is AVG and buf.dtype.kind == "f" and buf.itemsize == 2:
        return _wide_average(call, algo, buf, src, s, tag)
    tmp = call.state.pool.take(buf, s.scratch)
    return Plan(call, algo, (comm, buf, s.blocks, op, tmp, src), tag, None, (tmp,), buf,
                s.algo, src)


def _allreduce_setup(comm, buf, op, algorithm: str) -> Setup:
    """What an all-reduce's signature determines (`plan.Call.setup`): the key holds the
    size, dtype, op name and algorithm read here."""
    name = choose(comm, "allreduce", buf.nbytes, algorithm)
    blocks = Blocks.even(buf.size, comm.Get_size())
    found = entry("allreduce", name)
    return Setup(signed("allreduce", buf.size, buf.dtype, op, name), found, blocks,
                 found.scratch(blocks))


def _wide_average(call: Call, algo, buf, src, s: Setup, tag: int) -> Plan:
    """AVG of float16: summed in float32 (pooled, twice the bytes on the wire), divided by
    N there and rounded once to float16, so that a mean is not an overflowed sum (60000 on
    3 ranks) nor rounded at every step."""
    xp, pool = array_module(buf), call.state.pool
    work = pool.take(xp.empty(0, xp.float32), buf.size)
    tmp = pool.take(work, s.scratch)

    def finish():
        xp.copyto(buf, work, casting="same_kind")

    return Plan(call, copy_rounds, (work, buf if src is None else src, algo, call.comm, work,
                                    s.blocks, AVG, tmp, None), tag, finish, (tmp, work), work)


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
    counts = None if recvcounts is None else indices(recvcounts, "recvcounts")

    def layout() -> Blocks:
        return scatter_blocks(full.size, recvbuf.size, counts, in_place, n, rank)

    if op.exact and full.dtype.kind == "f":  # exact.py's passes (on integers SUM is exact)
        return exact.plan_exact(call, [flat(full)], flat(recvbuf)[: layout().counts[rank]], op,
                                algorithm, n, layout())
    op = SUM if op.exact else op

    def setup() -> Setup:
        blocks = layout()
        name = choose(comm, "reduce_scatter", full.nbytes, algorithm)
        found = entry("reduce_scatter", name)
        return Setup(signed("reduce_scatter", blocks.counts, full.dtype, op, name), found,
                     blocks, found.scratch(blocks))

    if call.debug:  # the arguments as passed, before auto's (collective) set-up
        check_algorithm("reduce_scatter", algorithm)
        call.agree("reduce_scatter", count=layout().counts, dtype=full.dtype, op=op.name,
                   algorithm=algorithm)
    s = call.setup(("reduce_scatter", in_place, full.size, recvbuf.size, counts, full.dtype,
                    op.name, algorithm), setup)
    tag, blocks = call.tag(s.signed), s.blocks
    hosts = locate(comm, call.state, "reduce_scatter", s.algo.name) if s.algo.placed else None
    out = flat(recvbuf)[: blocks.counts[rank]]
    if in_place and n == 1:  # the vector is its own result, where it is
        return Plan(call, no_rounds, (), tag)
    pool = call.state.pool
    work = pool.take(full, full.size)  # the partial sums: a pooled vector, reused across calls
    tmp = pool.take(work, s.scratch)
    # the input is read where it is: the algorithms never write it (one rank: a copy)
    src = flat(full) if n > 1 else None
    algo, args, found = s.algo.bound(hosts), (comm, work, blocks, op, tmp, src), s.algo
    if n == 1:
        algo, args, found = copy_rounds, (work, flat(full), algo, *args), None
    elif algo is ring_reduce_scatter:  # its last sum goes to recvbuf itself: no copy after
        return Plan(call, algo, (*args, out), tag, None, (tmp, work), work, found, src)

    def finish():
        out[...] = blocks.view(work, rank)  # in place: to the front, the rest untouched

    return Plan(call, algo, args, tag, finish, (tmp, work), work, found, src)


def plan_allgather(call: Call, sendbuf, recvbuf, recvcounts=None, displs=None,
                   algorithm: str = "auto") -> Plan:
    """Check and set up an all-gather: block r of `recvbuf` gets rank r's `sendbuf`.

    Args:
        recvcounts, displs: per-rank counts and offsets (``MPI_Allgatherv``); None
            means equal blocks of ``sendbuf.size`` items, packed (with IN_PLACE,
            ``recvbuf.size / N``), as ``MPI_Allgather``. The displacements are this
            rank's layout of recvbuf, its own (other ranks may have other ones, gaps,
            another order: what travels depends on the counts alone); the counts
            must be the same on every rank.
        sendbuf: this rank's block, or IN_PLACE: it is already at its place in recvbuf.
    """
    comm = call.comm
    n, rank = comm.Get_size(), comm.Get_rank()
    in_place = sendbuf is IN_PLACE
    check_pair(None if in_place else sendbuf, recvbuf)
    buf = flat(recvbuf)
    counts = None if recvcounts is None else indices(recvcounts, "recvcounts")
    offsets = None if displs is None else indices(displs, "displs")

    def layout() -> Blocks:
        return gather_blocks(None if in_place else sendbuf.size, buf.size, counts, offsets,
                             n, rank)

    def setup() -> Setup:
        blocks = layout()
        name = choose(comm, "allgather", blocks.total * buf.itemsize, algorithm)  # alike everywhere
        return Setup(signed("allgather", blocks.counts, buf.dtype, None, name),
                     entry("allgather", name), blocks)

    if call.debug:  # the arguments as passed (the counts; displs are each rank's own layout)
        check_algorithm("allgather", algorithm)
        call.agree("allgather", count=layout().counts, dtype=buf.dtype, algorithm=algorithm)
    s = call.setup(("allgather", None if in_place else sendbuf.size, buf.size, counts, offsets,
                    buf.dtype, algorithm), setup)
    tag = call.tag(s.signed)
    algo = s.algo.bound(locate(comm, call.state, "allgather", s.algo.name)) if s.algo.placed \
        else s.algo.rounds
    args = (comm, buf, s.blocks)
    if not (s.blocks.packed or s.algo.any_layout):  # my layout is mine alone: pack
        work = call.state.pool.take(buf, s.blocks.total)
        mine = s.blocks.view(buf, rank) if in_place else flat(sendbuf)
        return Plan(call, through_packed, (algo, *args, work, mine), tag, None, (work,), buf)
    if not in_place and s.algo.takes_src:  # it sends my block from sendbuf, then places it
        return Plan(call, algo, (*args, flat(sendbuf)), tag, None, (), buf)
    if not in_place:  # this rank's block to its place in recvbuf, at every run
        args = (s.blocks.view(buf, rank), flat(sendbuf), algo, *args)
        return Plan(call, copy_rounds, args, tag, None, (), buf)
    return Plan(call, algo, args, tag, None, (), buf, s.algo)


def plan_bcast(call: Call, buf, root: int = 0, algorithm: str = "auto") -> Plan:
    """Check and set up a broadcast of `buf` from `root` to every rank."""
    comm = call.comm
    root, n = index(root, "root"), comm.Get_size()
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not a rank of a communicator of size {n}")
    check_buffer(buf, "buf", writable=comm.Get_rank() != root)
    vec = flat(buf)

    def setup() -> Setup:
        name = choose(comm, "bcast", vec.nbytes, algorithm)
        return Setup(signed("bcast", vec.size, vec.dtype, None, name, root),
                     entry("bcast", name))

    if call.debug:  # the arguments as passed, before auto's (collective) set-up
        check_algorithm("bcast", algorithm)
        call.agree("bcast", count=vec.size, dtype=vec.dtype, algorithm=algorithm, root=root)
    s = call.setup(("bcast", vec.size, vec.dtype, root, algorithm), setup)
    tag = call.tag(s.signed)
    algo, args = s.algo.rounds, (comm, vec, root)
    if algo is scatter_allgather_bcast and not getattr(vec.flags, "writeable", True):
        # a read-only root buffer (MPI allows it): the ring writes the root's blocks back,
        # so it runs on a copy, made at every run
        vec = array_module(vec).empty_like(vec)
        return Plan(call, copy_rounds, (vec, args[1], algo, comm, vec, root), tag, None, (), vec)
    return Plan(call, algo, args, tag, None, (), vec, s.algo)


# ------------------------------------------------------------ rounds around an algorithm

def through_packed(algo, comm, buf, blocks: Blocks, work, mine) -> Rounds:
    """An all-gather into this rank's own layout `blocks`, run on `work`, packed.

    MPI_Allgatherv lets each rank lay out its recvbuf as it likes (gaps, any block
    order); only the counts agree. An algorithm that sends neighbouring blocks as one
    message cuts its messages by the layout, so every rank must see the same one:
    the packed one, in `work`. My block (`mine`: sendbuf, or in place its place in
    `buf`) goes there first, every block to its own place at the end.
    """
    xp, rank, packed = array_module(buf), comm.Get_rank(), Blocks(blocks.counts)
    xp.copyto(packed.view(work, rank), mine)
    yield from algo(comm, work, packed)
    for i in range(len(blocks)):
        xp.copyto(blocks.view(buf, i), packed.view(work, i))
