"""ZeRO's reducer: each bucket reduce-scattered, my shard stepped, the parameters all-gathered.

`DataParallel(..., zero=1|2|3)` runs this reducer (`reducers.py`'s protocol) with the
parameters' side of `zero.py` (stages 1, 2) or `zero3.py` (stage 3); `shards.py`
says where each rank's shard lies.
"""

from __future__ import annotations

from .. import collectives as mp
from .buckets import Bucket, Reduction, writers
from .determinism import average_parts, keep_apart
from .shards import Layout, shard_state, unshard_state
from .zero import GatherAfterStep, halves
from .zero3 import GatherPerUnit


class ReduceScatter:
    """ZeRO stages 1-3: buckets reduce-scattered, my shard stepped, parameters all-gathered.

    Stage 1 keeps the full gradient buffer (buckets are slices of it, their
    reduce-scatters planned once); stages 2 and 3 make each bucket just before
    backward writes its first unit and free it once its reduce-scatter is done
    (under `no_sync()`, the buckets live until the synced backward).
    """

    collective = "reduce_scatter"
    row_stops, pieces, across = None, {}, False  # whole buckets only
    splits_shards = property(lambda self: self.zero == 1)  # stages 2, 3: no bucket yet
    uneven = None  # set by `join.Joining` for a step some ranks sat out (`average_parts`)

    @staticmethod
    def check(model, optimizer, algorithm, prefetch: bool) -> dict:
        """Raise before any message if the model or the optimizer cannot be sharded; the
        names of the two halves (`zero.halves`)."""
        if optimizer is None:
            raise ValueError("sharded data parallelism updates the parameters itself: "
                             "pass optimizer=SGD(model.params, model.grads, ...) or Adam(...)")
        if len({p.dtype for p in model.params.values()}) != 1:
            raise TypeError("sharded data parallelism needs every parameter in one dtype")
        return halves(algorithm)

    def __init__(self, model, comm, buckets, optimizer, algorithm: dict, *, zero: int,
                 prefetch: bool = False, deterministic: bool = False, timeout=None):
        self.model, self.comm, self.buckets, self.zero = model, comm, buckets, zero
        self.algorithm, self.deterministic = algorithm, deterministic
        self._writes = writers(model, buckets)  # unit i -> the buckets it writes into
        xp, dtype = model.xp, next(iter(model.params.values())).dtype
        self.dtype = dtype
        shapes = {name: p.shape for name, p in model.params.items()}
        self.layout = layout = Layout(buckets, shapes, comm.Get_size(), comm.Get_rank(),
                                      each=zero == 3)  # stage 3: every unit cut in N
        gather = GatherPerUnit if zero == 3 else GatherAfterStep
        self.params = gather(model, comm, buckets, layout, algorithm["allgather"], prefetch,
                             timeout)
        if zero == 1:  # the full gradient buffer stays, the buckets are slices of it
            flat_grads = xp.zeros(layout.total, dtype=dtype)
            model.grads.update(layout.views(flat_grads))
            for b, (start, stop) in zip(buckets, layout.ranges, strict=True):
                b.flat = flat_grads[start:stop]  # fixed: its reduce-scatter is planned once
                if not deterministic:  # (deterministic: the ordered sum, `average_parts`)
                    b.plan = mp.reduce_scatter_init(comm, mp.IN_PLACE, b.flat,
                                                    layout.blocks[b.index].counts, op=mp.AVG,
                                                    algorithm=algorithm["reduce_scatter"])
            self.grad_shard = flat_grads[layout.lo:layout.hi]
        else:  # no full gradient between steps: buckets are made by backward, freed after
            for b in buckets:
                self._drop(b)
            self.grad_shard = xp.zeros(layout.hi - layout.lo, dtype=dtype)
        self.optimizer = optimizer.like({"flat": self.params.shard}, {"flat": self.grad_shard})
        if optimizer.steps:
            self.load_optimizer(optimizer)
        self._taken = [False] * len(buckets)  # bucket's part copied out of it

    # ------------------------------------------------------------ buckets

    def _drop(self, b: Bucket) -> None:
        """Stages 2, 3: let bucket b's buffer go (the model's grads of it too)."""
        b.flat = None
        for name in b.names:
            self.model.grads[name] = None

    def _make(self, b: Bucket) -> None:
        """Stages 2, 3: a buffer for bucket b, just before backward writes its first layer."""
        if b.flat is not None:  # no_sync: kept since the first micro-batch
            return
        start, stop = self.layout.ranges[b.index]
        b.flat = self.model.xp.empty(stop - start, dtype=self.dtype)
        self.model.grads.update(self.layout.views(b.flat, b.names, at=start))

    def accumulate(self, micro: int) -> bool:
        return micro > 0 and not self.deterministic  # deterministic: each micro-shard apart

    def reduction(self, b: Bucket) -> Reduction:
        return Reduction([lambda: self._start(b)])

    def _start(self, b: Bucket):
        counts = self.layout.blocks[b.index].counts
        if self.deterministic:  # my block at the bucket's front, as the in-place call's
            return average_parts(self.comm, b, b.flat[:counts[self.comm.Get_rank()]],
                                 self.algorithm["reduce_scatter"], counts, self.uneven,
                                 fixed=self.zero == 1)
        if b.plan is not None:  # stage 1
            b.plan.Start()
            return b.plan.request
        # stages 2, 3: a buffer of this backward's, so planned now
        return mp.ireduce_scatter(self.comm, mp.IN_PLACE, b.flat, counts, op=mp.AVG,
                                  algorithm=self.algorithm["reduce_scatter"])

    def _take(self, b: Bucket) -> None:
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

    def nbytes(self, b: Bucket) -> int:
        start, stop = self.layout.ranges[b.index]
        return (stop - start) * self.dtype.itemsize

    # ------------------------------------------------------------ the step's hooks

    def before_forward(self) -> None:
        self.params.before_forward()

    def after_layer(self, i: int) -> None:
        self.params.after_layer(i)

    def before_backward(self) -> None:
        self.params.before_backward()
        if self.zero >= 2:
            for b in self._writes[self.model.layers]:
                self._make(b)
        self._taken = [False] * len(self.buckets)

    def after_grad(self, i: int) -> None:
        if self.zero >= 2:
            self._take_done()  # free what is done: buckets in flight bound the peak
            if i > 1:  # unit i-1 is next: every bucket it writes into (a tied weight's
                for b in self._writes[i - 1]:  # was made for the unit that wrote it first)
                    self._make(b)
        self.params.after_grad(i)

    def after_backward(self, synced: bool) -> None:
        if synced:
            self._take_done()  # every launched bucket is done
        if self.deterministic:
            keep_apart(self.buckets, synced)

    def inflight(self) -> list:
        return self.params.inflight()

    def step(self) -> None:
        """Update my shard; all-gather the parameters (left running with ``prefetch``)."""
        self.params.wait()  # my shard may still be on its way to the others
        self.optimizer.step()
        self.params.after_step()

    def wait_params(self) -> None:
        self.params.wait()

    def gathered(self):
        return self.params.gathered()

    # ------------------------------------------------------------ state

    def load_optimizer(self, optimizer) -> None:
        """Take the state of `optimizer` (by parameter name, as saved) for my shard."""
        state = shard_state(self.layout, optimizer.state_dict(), self.model.xp, self.dtype)
        self.optimizer.load_state_dict(state)

    def full_optimizer(self):
        """An optimizer on the model's dicts holding everyone's state (collective)."""
        state = unshard_state(self.layout, self.comm, self.optimizer.state_dict(),
                              self.algorithm["allgather"])
        params = self.model.params
        if self.zero == 3:  # stand-ins of the parameters' shapes and dtype: never stepped
            params = self.layout.views(self.model.xp.empty(self.layout.total, self.dtype))
        full = self.optimizer.like(params, {})
        full.load_state_dict(state)
        return full

    def close(self) -> None:
        self.params.close()
        for b in self.buckets:
            if b.plan is not None:
                b.plan.Free()
