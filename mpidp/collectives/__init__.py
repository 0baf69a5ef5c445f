"""Collectives written from point-to-point calls, one generator of rounds each."""

from .api import (
    ALGORITHMS,
    IN_PLACE,
    allgather,
    allreduce,
    bcast,
    iallgather,
    iallreduce,
    ibcast,
    ireduce_scatter,
    reduce_scatter,
)
from .blocks import Blocks
from .buffers import ScratchPool
from .comm import Comm, Request
from .counting import CountingComm
from .ops import AVG, MAX, MIN, OPS, PROD, SUM, Op, resolve_op
from .schedule import Handle, testall, waitall

__all__ = [
    "ALGORITHMS", "AVG", "Blocks", "Comm", "CountingComm", "Handle", "IN_PLACE", "MAX", "MIN",
    "OPS", "Op", "PROD", "Request", "SUM", "ScratchPool", "allgather", "allreduce", "bcast",
    "iallgather", "iallreduce", "ibcast", "ireduce_scatter", "reduce_scatter", "resolve_op",
    "testall", "waitall",
]
