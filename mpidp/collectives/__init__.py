"""Collectives written from point-to-point calls, one generator of rounds each."""

from ..arrays import as_host
from .algorithms.blocks import Blocks
from .algorithms.ops import AVG, EXACT_AVG, EXACT_SUM, MAX, MIN, OPS, PROD, SUM, Op
from .api import (
    ALGORITHMS,
    IN_PLACE,
    TAG_BASE,
    allgather,
    allgather_init,
    allgatherv_init,
    allreduce,
    allreduce_init,
    allreduce_parts,
    allreduce_parts_init,
    bcast,
    bcast_init,
    check_algorithm,
    iallgather,
    iallreduce,
    iallreduce_parts,
    ibcast,
    ireduce_scatter,
    ireduce_scatter_parts,
    reduce_scatter,
    reduce_scatter_block_init,
    reduce_scatter_init,
    reduce_scatter_parts_init,
    sum_parts,
)
from .checks import check_buffer
from .dropin.comm import Comm, duplicate
from .dropin.counting import CountingComm
from .engine.completion import testall, waitall
from .engine.driver import Handle, Request
from .engine.staging import ScratchPool
from .mpiops import resolve_op
from .persistent import Persistent

__all__ = [
    "ALGORITHMS", "AVG", "Blocks", "Comm", "CountingComm", "EXACT_AVG", "EXACT_SUM",
    "Handle", "IN_PLACE", "MAX", "MIN", "OPS", "Op", "PROD", "Persistent", "Request", "SUM",
    "ScratchPool", "TAG_BASE", "allgather", "allgather_init", "allgatherv_init",
    "allreduce", "allreduce_init", "allreduce_parts", "allreduce_parts_init", "as_host",
    "bcast", "bcast_init", "check_algorithm", "check_buffer", "duplicate", "iallgather",
    "iallreduce", "iallreduce_parts", "ibcast", "ireduce_scatter", "ireduce_scatter_parts",
    "reduce_scatter", "reduce_scatter_block_init", "reduce_scatter_init",
    "reduce_scatter_parts_init", "resolve_op", "sum_parts", "testall", "waitall",
]
