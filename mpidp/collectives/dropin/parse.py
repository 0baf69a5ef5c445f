"""mpidp.Comm's arguments, as mpi4py takes them: parsed, checked, and handed to `api`'s plans.

Each function is one collective's: it turns the buffer specs into typed views
(`bufspec`), makes mpi4py's own checks (its exception types, before any
message), and returns the plan ``plans.plan_<collective>`` makes of them, for the
`Call` that already holds the collective's number.
"""

from __future__ import annotations

from .. import plans
from ..checks import index, indices
from ..plans import IN_PLACE
from .bufspec import check_match, in_place, simple, vector
from .datatypes import check_op


def allreduce(call, c, sendbuf, recvbuf, op, algorithm):
    """Allreduce(sendbuf, recvbuf, op): the two specs describe one message."""
    recv, count = simple(recvbuf, "recvbuf", writable=True)
    send = IN_PLACE
    if not in_place(sendbuf):
        send, scount = simple(sendbuf, "sendbuf")
        check_match(send, scount, recv, count)
    check_op(op, recvbuf, recv)
    return c._plan(call, plans.plan_allreduce, "allreduce", algorithm, send, recv, op=op)


def reduce_scatter_block(call, c, sendbuf, recvbuf, op, algorithm):
    """Reduce_scatter_block: a count given for sendbuf (or in place, recvbuf) is per block."""
    n = c.comm.Get_size()
    if in_place(sendbuf):  # the n blocks are in recvbuf; a count given is per block
        recv, _ = simple(recvbuf, "recvbuf", blocks=n, writable=True)
        send = IN_PLACE
    else:
        recv, count = simple(recvbuf, "recvbuf", writable=True)
        send, scount = simple(sendbuf, "sendbuf", blocks=n)
        check_match(send, scount, recv, count)
    check_op(op, recvbuf, recv)
    return c._plan(call, plans.plan_reduce_scatter, "reduce_scatter", algorithm, send, recv,
                      op=op)


def reduce_scatter(call, c, sendbuf, recvbuf, recvcounts, op, algorithm):
    """Reduce_scatter: recvcounts given, or gathered from every rank's recvbuf count."""
    n, rank = c.comm.Get_size(), c.comm.Get_rank()
    recv, count = simple(recvbuf, "recvbuf", writable=True)
    if in_place(sendbuf):
        if recvcounts is None:
            raise TypeError("Reduce_scatter with sendbuf=IN_PLACE needs recvcounts")
        send, total = IN_PLACE, count
    else:
        send, total = simple(sendbuf, "sendbuf")
        check_match(send, None, recv, None)  # the datatypes; the counts differ here
    check_op(op, recvbuf, recv)  # before the gather below: refused before any message
    if send is not IN_PLACE and recvcounts is None:  # as mpi4py: every rank's count, gathered
        recvcounts = c._gather_counts(count)
    recvcounts = list(indices(recvcounts, "recvcounts"))
    if len(recvcounts) != n:
        raise ValueError(f"expecting {n} recvcounts, got {len(recvcounts)}")
    if total != sum(recvcounts):
        raise ValueError(f"mismatch in {'receive' if send is IN_PLACE else 'send'} "
                         f"count {total} and sum(recvcounts) {sum(recvcounts)}")
    if send is not IN_PLACE and count != recvcounts[rank]:
        raise ValueError(f"mismatch in receive count {count} and "
                         f"recvcounts[{rank}] {recvcounts[rank]}")
    return c._plan(call, plans.plan_reduce_scatter, "reduce_scatter", algorithm, send, recv,
                      recvcounts=recvcounts, op=op)


def allgather(call, c, sendbuf, recvbuf, algorithm):
    """Allgather: a count given for recvbuf is per rank, as in MPI."""
    recv, count = simple(recvbuf, "recvbuf", blocks=c.comm.Get_size(), writable=True)
    send = IN_PLACE
    if not in_place(sendbuf):
        send, scount = simple(sendbuf, "sendbuf")
        check_match(send, scount, recv, count)
    return c._plan(call, plans.plan_allgather, "allgather", algorithm, send, recv)


def allgatherv(call, c, sendbuf, recvbuf, algorithm):
    """Allgatherv: recvbuf is a vector spec, [buf, counts, displs, type]."""
    recv, counts, displs = vector(recvbuf, "recvbuf", c.comm.Get_size())
    send = IN_PLACE
    if not in_place(sendbuf):
        send, scount = simple(sendbuf, "sendbuf")
        rank = c.comm.Get_rank()
        check_match(send, scount, recv, counts[rank], f"recvcounts[{rank}]")
    return c._plan(call, plans.plan_allgather, "allgather", algorithm, send, recv,
                      recvcounts=counts, displs=displs)


def bcast(call, c, buf, root, algorithm):
    """Bcast: buf is written everywhere but at the root."""
    root = index(root, "root")
    data, _ = simple(buf, "buf", writable=c.comm.Get_rank() != root)
    return c._plan(call, plans.plan_bcast, "bcast", algorithm, data, root=root)
