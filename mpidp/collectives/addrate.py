"""The adds' rate at one vector's size: the cost model's γ where the ordered sum's route needs it.

`cost.calibrate` fits γ with α and β to whole all-reduces at 8 B to 1 MiB; it comes
out anywhere from 0.01 to 0.3 ns per byte from run to run on one machine
(docs/benchmarks-notes.md), while the ordered sum's two paths (`ordered_chain.route`)
differ mostly in how many passes of adds each puts on the critical path. So where the
model was calibrated (not given: ``MPIDP_COST``, `set_model`), the route prices its
adds at the rate measured here: ``acc += part`` over the vector's items (at most
PROBE_ITEMS: beyond, the rate is memory's), the fastest of REPS after one that warms
the cache as a bucket's adds do, the slowest rank's. Collective, once per signature
(`plan.Call.setup` keeps the route).
"""

from __future__ import annotations

import time

import numpy as np

from .algorithms.blocks import Blocks
from .algorithms.doubling import recursive_doubling_allreduce
from .algorithms.ops import MAX
from .engine.driver import run
from .state import state

PROBE_ITEMS = 1 << 20  # items added at most (4 MiB of float32: out of every core's cache)
REPS = 3


def add_rate(comm, count: int, dtype, wide) -> float:
    """Seconds per byte of `dtype` added into a `wide` accumulator over `count` items
    (``acc += part``), the slowest rank's; collective: every rank calls it alike."""
    items = max(1, min(count, PROBE_ITEMS))
    acc, part = np.zeros(items, wide), np.ones(items, dtype)
    np.add(acc, part, out=acc)  # warm: first touch, and the cache as the sum finds it
    best = np.inf
    for _ in range(REPS):
        t0 = time.perf_counter()
        np.add(acc, part, out=acc)
        best = min(best, time.perf_counter() - t0)
    mine, slowest = np.array([best / (items * np.dtype(dtype).itemsize)]), np.empty(1)
    st = state(comm)
    slot = st.take()
    try:
        run(comm, recursive_doubling_allreduce(comm, slowest, Blocks.even(1, comm.Get_size()),
                                               MAX, np.empty(1), mine), st.tag(slot))
    finally:
        st.release(slot)
    return float(slowest[0])
