"""Collectives written from point-to-point calls, one generator of rounds each."""

from .api import (
    ALGORITHMS,
    IN_PLACE,
    TAG_BASE,
    allgather,
    allreduce,
    bcast,
    check_algorithm,
    iallgather,
    iallreduce,
    ibcast,
    ireduce_scatter,
    reduce_scatter,
)
from .blocks import Blocks
from .buffers import ScratchPool, as_host
from .checks import check_buffer
from .comm import Comm, duplicate
from .counting import CountingComm
from .ops import AVG, MAX, MIN, OPS, PROD, SUM, Op, resolve_op
from .persistent import (
    Persistent,
    allgather_init,
    allgatherv_init,
    allreduce_init,
    bcast_init,
    reduce_scatter_block_init,
    reduce_scatter_init,
)
from .schedule import Handle, Request, testall, waitall

__all__ = [
    "ALGORITHMS", "AVG", "Blocks", "Comm", "CountingComm", "Handle", "IN_PLACE", "MAX", "MIN",
    "OPS", "Op", "PROD", "Persistent", "Request", "SUM", "ScratchPool", "TAG_BASE", "allgather",
    "allgather_init", "allgatherv_init", "allreduce", "allreduce_init", "as_host", "bcast",
    "bcast_init", "check_algorithm", "check_buffer", "duplicate", "iallgather", "iallreduce",
    "ibcast", "ireduce_scatter", "reduce_scatter", "reduce_scatter_block_init",
    "reduce_scatter_init", "resolve_op", "testall", "waitall",
]
