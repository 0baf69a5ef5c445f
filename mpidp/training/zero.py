"""Sharded data parallelism: ZeRO stages 1 and 2, from reduce-scatter and all-gather.

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

import time
from types import SimpleNamespace

from .. import collectives as mp
from .ddp import DataParallel
from .shards import Layout, shard_state, unshard_state

# an all-reduce name -> its two halves, (reduce-scatter, all-gather)
HALVES = {"auto": ("auto", "auto"), "ring": ("ring", "ring"),
          "rabenseifner": ("recursive_halving", "recursive_doubling")}
NO_PLAN = SimpleNamespace(Free=lambda: None)  # a stage-2 bucket's: its buffer is new each step


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


class ShardedDataParallel(DataParallel):
    """`DataParallel` with the optimizer state (stage 1) and the gradients (stage 2) sharded.

    Built by ``DataParallel(..., zero=1|2, optimizer=opt)``, or directly. Arguments
    as `DataParallel`'s, and:

    Args:
        optimizer: an optimizer built on the model's dicts (`SGD`, `Adam`, `AdamW`): its
            kind and hyper-parameters, and its state if it has any (a loaded
            checkpoint), are taken for this rank's shard. Step with ``step()``, not it.
        zero: 1 or 2.
        algorithm: ``"auto"``, ``"ring"``, ``"rabenseifner"`` (recursive halving +
            recursive doubling) or ``{"reduce_scatter": name, "allgather": name}``.
        prefetch: `step()` leaves the all-gather running; forward waits layer by layer.

    Attributes: ``flat_params`` (``model.params`` are views of it), ``grad_shard``
    (this rank's averaged gradients), ``optimizer`` (the shard's), ``layout``.
    """

    bucket_collective = "reduce_scatter"  # what a trace calls each bucket's collective

    def __init__(self, model, comm, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 overlap: bool = True, algorithm="auto", progress_thread: bool = False,
                 debug: bool = False, tracer=None, progress_interval_s: float = 1e-4,
                 timeout: float | None = None, *, optimizer=None, zero: int = 1,
                 prefetch: bool = False, deterministic: bool = False):
        if zero not in (1, 2):
            raise ValueError(f"zero must be 1 or 2 for sharded data parallelism, not {zero!r}")
        if optimizer is None:
            raise ValueError("sharded data parallelism updates the parameters itself: "
                             "pass optimizer=SGD(model.params, model.grads, ...) or Adam(...)")
        if len({p.dtype for p in model.params.values()}) != 1:
            raise TypeError("sharded data parallelism needs every parameter in one dtype")
        halved = halves(algorithm)
        self._gathers: list = []  # the parameters' all-gathers in flight, forward order
        # the parent checks an all-reduce name and calibrates its comm's model for "auto"
        auto = "auto" in halved.values()
        super().__init__(model, comm, bucket_mb, first_bucket_mb, overlap,
                         "auto" if auto else "ring", progress_thread, debug, None,
                         progress_interval_s, timeout, deterministic=deterministic)
        self.algorithm, self.zero, self.prefetch = halved, zero, prefetch
        for b in self.buckets:  # the parent's persistent all-reduces: never started, unused
            if b.plan is not None:
                b.plan.Free()
            b.plan = NO_PLAN
        xp, dtype = model.xp, next(iter(model.params.values())).dtype
        shapes = {name: p.shape for name, p in model.params.items()}
        self.layout = layout = Layout(self.buckets, shapes, self.comm.Get_size(),
                                      self.comm.Get_rank())
        # parameters: one flat vector in bucket order; model.params become views of it
        self.flat_params = layout.flatten(model.params, xp, dtype)
        model.params.update(layout.views(self.flat_params))
        if zero == 1:  # the full gradient buffer stays, the buckets are slices of it
            flat_grads = xp.zeros(layout.total, dtype=dtype)
            model.grads.update(layout.views(flat_grads))
            for b, (start, stop) in zip(self.buckets, layout.ranges, strict=True):
                b.flat = flat_grads[start:stop]  # fixed: its reduce-scatter is planned once
                if deterministic:  # the exact sum of a step's parts: planned at each launch
                    continue
                b.plan = mp.reduce_scatter_init(self.comm, mp.IN_PLACE, b.flat,
                                                layout.blocks[b.index].counts, op=mp.AVG,
                                                algorithm=halved["reduce_scatter"])
            self.grad_shard = flat_grads[layout.lo:layout.hi]
        else:  # no full gradient between steps: buckets are made by backward, freed after
            for b in self.buckets:
                self._drop(b)
            self.grad_shard = xp.zeros(layout.hi - layout.lo, dtype=dtype)
        # the parameters' all-gathers, planned once, in forward order (layer 1 first)
        self._gather_plans = [
            mp.allgatherv_init(self.comm, mp.IN_PLACE, self.flat_params[start:stop],
                               layout.blocks[k].counts, algorithm=halved["allgather"])
            for k, (start, stop) in reversed(list(enumerate(layout.ranges)))]
        mine = self.flat_params[layout.lo:layout.hi]
        self.optimizer = optimizer.like({"flat": mine}, {"flat": self.grad_shard})
        if optimizer.steps:
            self.load_optimizer(optimizer)
        self._taken = [False] * len(self.buckets)  # bucket's part copied out of it
        if tracer is not None:
            tracer.follow(self)

    # ------------------------------------------------------------ buckets

    def _drop(self, b) -> None:
        """Stage 2: let bucket b's buffer go (the model's grads of it too)."""
        b.flat = None
        for name in b.names:
            self.model.grads[name] = None

    def _make(self, b) -> None:
        """Stage 2: a buffer for bucket b, just before backward writes its first layer."""
        if b.flat is not None:  # no_sync: kept since the first micro-batch
            return
        start, stop = self.layout.ranges[b.index]
        b.flat = self.model.xp.empty(stop - start, dtype=self.flat_params.dtype)
        self.model.grads.update(self.layout.views(b.flat, b.names, at=start))

    def _launch(self, b) -> None:
        b.launched = time.perf_counter()
        counts = self.layout.blocks[b.index].counts
        if self.deterministic:  # my block at the bucket's front, as the in-place call's
            b.request = self._exact(b, b.flat[:counts[self.comm.Get_rank()]], counts)
        elif b.plan is not NO_PLAN:  # stage 1
            b.plan.Start()
            b.request = b.plan.request
        else:  # stage 2: a buffer of this backward's, so planned now
            b.request = mp.ireduce_scatter(self.comm, mp.IN_PLACE, b.flat, counts, op=mp.AVG,
                                           algorithm=self.algorithm["reduce_scatter"])
        if self._thread is not None:
            self._work.set()

    def _take(self, b) -> None:
        """Bucket b's reduce-scatter is done: my part (at its front, as MPI puts it) to my shard."""
        in_bucket, in_shard, count = self.layout.mine(b.index)
        if self.zero == 1:
            if in_bucket and count:  # back to its own place in the flat gradient
                front = b.flat[:count]
                b.flat[in_bucket:in_bucket + count] = front.copy() if in_bucket < count else front
        else:
            self.grad_shard[in_shard:in_shard + count] = b.flat[:count]
            self._drop(b)
        self._taken[b.index] = True

    def _take_done(self) -> None:
        for b in self.buckets:
            # test(), not .done: a progress thread may be finishing it right now
            if b.request is not None and not self._taken[b.index] and b.request.test():
                self._take(b)

    def on_grad(self, i: int) -> None:
        super().on_grad(i)
        if self.zero == 2:
            self._take_done()  # free what is done: buckets in flight bound the peak
            if i > 1:  # unit i-1 is next: every bucket it writes into (a tied weight's
                for b in self._writes[i - 1]:  # was made for the unit that wrote it first)
                    self._make(b)

    def backward(self, dlogits, timeout: float | None = None) -> None:
        """Backward with bucketed reduce-scatter; on return ``grad_shard`` holds my average."""
        self.wait_params()
        if self.zero == 2:
            for b in self._writes[self.model.layers]:
                self._make(b)
        self._taken = [False] * len(self.buckets)
        super().backward(dlogits, timeout)
        self._take_done()  # after the parent's wait: every launched bucket is done

    # ------------------------------------------------------------ parameters

    def step(self) -> None:
        """Update my shard; all-gather the parameters (left running with ``prefetch``)."""
        self.wait_params()  # my shard may still be on its way to the others
        self.optimizer.step()
        for plan in self._gather_plans:
            plan.Start()
        self._gathers = [plan.request for plan in self._gather_plans]
        if not self.prefetch:
            self.wait_params()

    def wait_params(self) -> None:
        """Complete the parameters' all-gathers in flight: every rank holds all of them."""
        if self._gathers:
            mp.waitall(self._gathers, self.timeout)
            self._gathers = []

    def forward(self, x):
        if not self._gathers:
            return super().forward(x)
        last = self.model.layers

        def on_layer(i: int) -> None:  # unit i is done; wait for unit i+1's parameters
            if self.on_layer is not None:
                self.on_layer(i)
            if i < last:
                self._wait_layer(i + 1)

        self._wait_layer(1)
        return self.model.forward(x, on_layer=on_layer)

    def _wait_layer(self, i: int) -> None:
        """Wait for the all-gathers of every bucket that unit i reads (a tied weight's too)."""
        for b in self._writes[i]:
            k = len(self.buckets) - 1 - b.index  # its place in `_gathers`
            if self._gathers:
                mp.waitall([self._gathers[k]], self.timeout)
                if mp.testall(self._gathers):  # advance the others too
                    self._gathers = []

    def check_replicas(self) -> None:
        self.wait_params()
        super().check_replicas()

    # ------------------------------------------------------------ state

    def load_optimizer(self, optimizer) -> None:
        """Take the state of `optimizer` (by parameter name, as saved) for my shard."""
        state = shard_state(self.layout, optimizer.state_dict(), self.model.xp,
                            self.flat_params.dtype)
        self.optimizer.load_state_dict(state)

    def full_optimizer(self):
        """An optimizer on the model's dicts holding everyone's state (collective).

        What a checkpoint saves, so that any rank count and any stage can load it.
        """
        state = unshard_state(self.layout, self.comm, self.optimizer.state_dict(),
                              self.algorithm["allgather"])
        full = self.optimizer.like(self.model.params, self.model.grads)
        full.load_state_dict(state)
        return full

    def bucket_times(self) -> list[dict]:
        itemsize = self.flat_params.itemsize
        return [{"bucket": b.index, "layers": b.layers,
                 "bytes": (stop - start) * itemsize, "launch": b.launched - self.t_backward,
                 "complete": b.request.completed_at - self.t_backward}
                for b, (start, stop) in zip(self.buckets, self.layout.ranges, strict=True)
                if b.request is not None and b.request.done]

    def close(self) -> None:
        self.wait_params()
        for plan in self._gather_plans:
            plan.Free()
        super().close()  # frees each bucket's plan
