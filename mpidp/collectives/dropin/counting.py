"""CountingComm: a communicator proxy that counts the bytes and messages each rank sends.

The collectives call only point-to-point methods of the comm they are given, so
wrapping a communicator is enough to measure an algorithm's traffic::

    counter = CountingComm(MPI.COMM_WORLD)
    mpidp.allreduce(counter, x, y, algorithm="ring")
    counter.bytes_sent   # == 2 * x.nbytes * (N - 1) / N when N divides x.size
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI


def nbytes(spec) -> int:
    """Bytes in an mpi4py buffer spec: ``buf``, ``[buf, type]``, ``[buf, count, type]``."""
    if isinstance(spec, (list, tuple)):
        buf = spec[0]
        if len(spec) >= 3 and isinstance(spec[1], int) and isinstance(spec[-1], MPI.Datatype):
            return spec[1] * spec[-1].Get_size()
        return _nbytes(buf)
    return _nbytes(spec)


def _nbytes(buf) -> int:
    if hasattr(buf, "nbytes"):
        return int(buf.nbytes)
    return memoryview(buf).nbytes if buf is not None else 0


class CountingComm:
    """Forwards everything to `comm`; counts what goes through the send/receive calls."""

    def __init__(self, comm, placement=None):
        """`placement`: the host of each rank, as the algorithms should see it (a test of
        traffic across hosts on one machine); None: the wrapped comm's (`topology`)."""
        self.comm = comm
        if placement is not None:
            self.placement = tuple(placement)
        self.reset()

    def reset(self) -> None:
        self.bytes_sent = 0
        self.bytes_received = 0  # receive-buffer sizes posted (upper bound of what arrived)
        self.messages_sent = 0
        self.peers: set[int] = set()
        self.bytes_to: dict[int, int] = {}  # peer -> bytes sent to it (traffic across hosts)

    def _sent(self, spec, dest) -> None:
        size = nbytes(spec)
        self.bytes_sent += size
        self.messages_sent += 1
        self.peers.add(dest)
        self.bytes_to[dest] = self.bytes_to.get(dest, 0) + size

    def Isend(self, buf, dest, tag=0):  # noqa: N802
        self._sent(buf, dest)
        return self.comm.Isend(buf, dest, tag)

    def Send(self, buf, dest, tag=0):  # noqa: N802
        self._sent(buf, dest)
        return self.comm.Send(buf, dest, tag)

    def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):  # noqa: N802
        self.bytes_received += nbytes(buf)
        return self.comm.Irecv(buf, source, tag)

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):  # noqa: N802
        self.bytes_received += nbytes(buf)
        return self.comm.Recv(buf, source, tag, status)

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,  # noqa: N802
                 recvtag=MPI.ANY_TAG, status=None):
        self._sent(sendbuf, dest)
        self.bytes_received += nbytes(recvbuf)
        return self.comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def totals(self) -> np.ndarray:
        """[bytes_sent, messages_sent] of this rank, as an array (for gathering)."""
        return np.array([self.bytes_sent, self.messages_sent], dtype=np.int64)
