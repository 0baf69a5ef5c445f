"""Communicator stand-ins the tests wrap around a real one, or use instead of one."""

from mpi4py import MPI


class NoCollectives:
    """A communicator whose own collectives fail: proves mpidp.Comm never calls them."""

    COLLECTIVES = {"Allreduce", "Iallreduce", "Reduce_scatter", "Ireduce_scatter",
                   "Reduce_scatter_block", "Ireduce_scatter_block", "Allgather", "Iallgather",
                   "Allgatherv", "Iallgatherv", "Bcast", "Ibcast", "Barrier", "Reduce",
                   "Gather", "Alltoall", "allreduce", "allgather", "bcast"}

    def __init__(self, comm):
        self.comm = comm
        self.tags = []  # the tag of every message sent or received

    def __getattr__(self, name):
        if name in self.COLLECTIVES:
            raise AssertionError(f"mpidp.Comm called the wrapped comm's {name}")
        return getattr(self.comm, name)

    def Isend(self, buf, dest, tag=0):  # noqa: N802
        self.tags.append(tag)
        return self.comm.Isend(buf, dest, tag)

    def Irecv(self, buf, source, tag):  # noqa: N802
        self.tags.append(tag)
        return self.comm.Irecv(buf, source, tag)

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):  # noqa: N802
        self.tags += [sendtag, recvtag]
        return self.comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag)


class NarrowTags:
    """A communicator that reports the smallest tag bound MPI allows (32767) and records
    every tag it carries; it wraps `comm` without exposing it, so mpidp takes it as a
    comm-like object of its own (its own tag sequence, its own bound)."""

    TAG_UB = 32767

    def __init__(self, comm):
        self._comm = comm
        self.tags = []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Get_attr(self, keyval):  # noqa: N802
        from mpi4py import MPI

        return self.TAG_UB if keyval == MPI.TAG_UB else self._comm.Get_attr(keyval)

    def Isend(self, buf, dest, tag=0):  # noqa: N802
        self.tags.append(tag)
        return self._comm.Isend(buf, dest, tag)

    def Irecv(self, buf, source, tag):  # noqa: N802
        self.tags.append(tag)
        return self._comm.Irecv(buf, source, tag)

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):  # noqa: N802
        self.tags += [sendtag, recvtag]
        return self._comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag)

    def Send_init(self, buf, dest, tag=0):  # noqa: N802
        self.tags.append(tag)
        return self._comm.Send_init(buf, dest, tag)

    def Recv_init(self, buf, source, tag):  # noqa: N802
        self.tags.append(tag)
        return self._comm.Recv_init(buf, source, tag)


class Loopback:
    """A comm of two ranks, this one rank 0, whose peer sends back what it is sent: one
    `Sendrecv`, or (the driver under a deadline) an `Irecv` posted before its `Isend`."""

    def Get_rank(self):  # noqa: N802
        return 0

    def Get_size(self):  # noqa: N802
        return 2

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):  # noqa: N802
        recvbuf[0][...] = sendbuf[0]

    def Irecv(self, buf, source, tag):  # noqa: N802
        self.into = buf[0]
        return MPI.REQUEST_NULL

    def Isend(self, buf, dest, tag):  # noqa: N802
        self.into[...] = buf[0]
        return MPI.REQUEST_NULL
