"""Sharded data parallelism: ZeRO stages 1 and 2, from reduce-scatter and all-gather.

`DataParallel(..., zero=1|2)` composes `reducers.ReduceScatter` (the gradients' side,
the sharded step) with `GatherAfterStep` here (the parameters' side).

Plain data parallelism keeps the whole model on every rank: P parameters, G
gradients and K·P optimizer state (K = 1 for SGD with momentum, 2 for Adam).
All-reduce = reduce-scatter + all-gather (the article's two halves), and
between the halves each rank holds one complete block of the averaged
gradient. ZeRO (Rajbhandari et al. 2020) stops there: each rank updates only
its block, its shard, so it keeps optimizer state only for it; the second half
then moves updated parameters instead of gradients. Who holds what between
steps, N = 4 (one column per quarter of the flat vector, `shards.py`):

                 rank 0           rank 1           rank 2           rank 3
    stage 0   P ████ G ████    P ████ G ████    P ████ G ████    P ████ G ████
              S ████           S ████           S ████           S ████         P + G + K·P
    stage 1   P ████ G ████    P ████ G ████    P ████ G ████    P ████ G ████
              S █···           S ·█··           S ··█·           S ···█         P + G + K·P/N
    stage 2   P ████ G █···    P ████ G ·█··    P ████ G ··█·    P ████ G ···█
              S █···           S ·█··           S ··█·           S ···█         P + G/N + K·P/N

One step on rank r, N = 4, 3 buckets (bucket 0 = last layer, done first):

    backward L3     bucket 0 complete: reduce-scatter(avg) it; my part -> my gradient shard
    backward L2     bucket 1 complete: reduce-scatter(avg) it; bucket 0's done? take my part
    backward L1     bucket 2 complete: reduce-scatter(avg) it
    wait            every reduce-scatter done; stage 2 frees each bucket buffer then
    step()          the optimizer updates my quarter of the parameters and of its state
    all-gather      each bucket's parameters, in forward order: every rank whole again

Stage 1 keeps the full gradient buckets allocated (and reduce-scatters into
them); stage 2 allocates each bucket as backward reaches the first unit that
writes into it (a tied weight's bucket at the first of its units: the GPT's
embedding bucket lives through the whole backward) and frees it once
its reduce-scatter is done (under `no_sync()`, the buckets live until the
synced backward). Every update is elementwise, so updating a shard gives the
bits that updating the whole would: N ranks still train like one rank on the
global batch, and every rank holds the same parameters after the all-gather.
With ``prefetch=True`` the all-gather runs into the next forward: `step()`
starts it, and forward waits for each layer's bucket just before that layer.

Cost per step, per rank, G bytes of gradients (= parameters):

    reduce-scatter   (N-1)α + G(N-1)/N·β + G(N-1)/N·γ
    all-gather       (N-1)α + G(N-1)/N·β
    in all           2·G·(N-1)/N bytes, as plain data parallelism's all-reduce
    (PyTorch's ZeroRedundancyOptimizer all-reduces the gradients, then shares the
     parameters: 3·G·(N-1)/N)

Reference: Rajbhandari, Rasley, Ruwase, He, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", SC 2020.
"""

from __future__ import annotations

from contextlib import contextmanager

from .. import collectives as mp
from .buckets import writers

# an all-reduce name -> its two halves, (reduce-scatter, all-gather)
HALVES = {"auto": ("auto", "auto"), "ring": ("ring", "ring"),
          "rabenseifner": ("recursive_halving", "recursive_doubling")}


def halves(algorithm) -> dict:
    """``{"reduce_scatter": name, "allgather": name}`` from an all-reduce name or such a dict."""
    if isinstance(algorithm, str):
        if algorithm not in HALVES:
            raise ValueError(f"sharded data parallelism runs reduce-scatter + all-gather: "
                             f"algorithm must be one of {list(HALVES)} or a dict "
                             f"{{'reduce_scatter': ..., 'allgather': ...}}, not {algorithm!r}")
        algorithm = dict(zip(("reduce_scatter", "allgather"), HALVES[algorithm], strict=True))
    out = {c: algorithm.get(c, "auto") for c in ("reduce_scatter", "allgather")}
    for collective, name in out.items():
        mp.check_algorithm(collective, name)
    return out


class GatherAfterStep:
    """Stages 1, 2: every rank holds every parameter; after the step, the shards all-gathered.

    The parameters lie in one flat vector in bucket order (``flat``; ``model.params``
    become views of it); my ``shard`` is a view of my part, the one the optimizer
    updates. Each bucket's all-gather is planned once, in forward order (layer 1
    first). With ``prefetch``, `after_step` leaves them running and forward waits,
    before each unit, for the buckets it reads.
    """

    def __init__(self, model, comm, buckets, layout, algorithm: str, prefetch: bool, timeout):
        self.model, self.buckets, self.prefetch, self.timeout = model, buckets, prefetch, timeout
        xp, dtype = model.xp, next(iter(model.params.values())).dtype
        self.flat = layout.flatten(model.params, xp, dtype)
        model.params.update(layout.views(self.flat))
        self.shard = self.flat[layout.lo:layout.hi]
        self._plans = [mp.allgatherv_init(comm, mp.IN_PLACE, self.flat[start:stop],
                                          layout.blocks[k].counts, algorithm=algorithm)
                       for k, (start, stop) in reversed(list(enumerate(layout.ranges)))]
        self._gathers: list = []  # the all-gathers in flight, forward order
        self._writes = writers(model, buckets)

    def after_step(self) -> None:
        for plan in self._plans:
            plan.Start()
        self._gathers = [plan.request for plan in self._plans]
        if not self.prefetch:
            self.wait()

    def wait(self) -> None:
        """Complete the all-gathers in flight: every rank holds every parameter."""
        if self._gathers:
            mp.waitall(self._gathers, self.timeout)
            self._gathers = []

    def inflight(self) -> list:
        return self._gathers

    def held(self) -> list:
        """The parameter arrays this rank keeps: all of them, in one flat vector."""
        return [self.flat]

    def before_forward(self) -> None:
        self._wait_unit(1)

    def after_layer(self, i: int) -> None:  # unit i is done; wait for unit i+1's parameters
        if i < self.model.layers:
            self._wait_unit(i + 1)

    def _wait_unit(self, i: int) -> None:
        """Wait for the all-gathers of every bucket that unit i reads (a tied weight's too)."""
        for b in self._writes[i]:
            k = len(self.buckets) - 1 - b.index  # its place in `_gathers`
            if self._gathers:
                mp.waitall([self._gathers[k]], self.timeout)
                if mp.testall(self._gathers):  # advance the others too
                    self._gathers = []

    def before_backward(self) -> None:
        self.wait()

    def after_grad(self, i: int) -> None: ...

    @contextmanager
    def gathered(self):
        self.wait()
        yield self.model.params

    def close(self) -> None:
        self.wait()
        for plan in self._plans:
            plan.Free()
