"""Gradient reducers: what `DataParallel` does with a bucket once backward has filled it.

`DataParallel` (ddp.py) runs the loop every stage shares: the model's hooks, the
buckets launched in order as backward completes them, progress, the wait. What a
bucket's reduction is, and what `step()` then does, is the reducer's:

    AllReduce       stage 0: each bucket all-reduced (average); every rank then runs
                    the same optimizer step on the whole model
    ReduceScatter   stages 1-3 (ZeRO): each bucket reduce-scattered, my block kept as my
                    gradient shard; the optimizer steps my shard only; the parameters
                    come back by all-gather, from `zero.GatherAfterStep` (stages 1, 2:
                    after the step) or `zero3.GatherPerUnit` (stage 3: just in time)

The protocol, in a step's order (every method called on every rank alike):

    before_forward(), after_layer(i)       forward: before unit 1, after unit i
    before_backward()                      before the model's backward
    start(b) -> Request                    launch bucket b's reduction
    after_grad(i)                          unit i's gradients are written (and maybe launched)
    after_backward()                       every bucket's reduction is done (a synced backward)
    step()                                 the optimizer's update
    inflight() -> [Request]                besides the buckets', what progress should advance
    nbytes(b), collective                  what `bucket_times` and a trace report
    gathered(), wait_params(), full_optimizer(), load_optimizer(opt), close()

Stage 3 plugs into the same hooks: its parameters are gathered per unit in
``before_forward``/``after_layer`` and ``before_backward``/``after_grad``, freed
after, and nothing is gathered after the step.
"""

from __future__ import annotations

from contextlib import contextmanager

from .. import collectives as mp
from .buckets import Bucket, writers
from .shards import Layout, shard_state, unshard_state
from .zero import GatherAfterStep
from .zero3 import GatherPerUnit

STAGES = (0, 1, 2, 3)


def exact(comm, b: Bucket, out, algorithm: str, counts=None):
    """Start the exact average of bucket b's micro-shards, all ranks', into `out`.

    ``counts``: reduce-scatter it instead (ZeRO), rank r's block into its `out`.
    """
    parts = [*b.parts, b.flat]
    addends = comm.Get_size() * len(parts)  # every rank runs as many micro-shards
    if counts is None:
        return mp.iallreduce_parts(comm, parts, out, addends=addends, algorithm=algorithm,
                                   average=True)
    return mp.ireduce_scatter_parts(comm, parts, out, counts, addends=addends,
                                    algorithm=algorithm, average=True)


class AllReduce:
    """Stage 0: every bucket all-reduced (persistent, planned once); every rank steps alike."""

    collective = "allreduce"

    @staticmethod
    def check(model, optimizer) -> None:
        """Nothing to check before any message: any optimizer, or none (step() unused)."""

    def __init__(self, model, comm, buckets, optimizer, algorithm: str, *, zero: int = 0,
                 prefetch: bool = False, deterministic: bool = False, timeout=None,
                 pieced: frozenset = frozenset()):
        self.model, self.comm, self.buckets, self.optimizer = model, comm, buckets, optimizer
        self.algorithm, self.deterministic = algorithm, deterministic
        for b in buckets:  # planned once: each step only starts them
            # (deterministic: the exact sum of a step's parts, planned at each launch;
            # `pieced` buckets go in pieces, each planned by pieces.py, never whole)
            if not deterministic and b.index not in pieced:
                b.plan = mp.allreduce_init(comm, mp.IN_PLACE, b.flat, op=mp.AVG,
                                           algorithm=algorithm)

    def start(self, b: Bucket):
        if self.deterministic:
            return exact(self.comm, b, b.flat, self.algorithm)
        b.plan.Start()
        return b.plan.request

    def nbytes(self, b: Bucket) -> int:
        return int(b.flat.nbytes)

    # every rank holds every parameter and gradient: nothing to do around the units
    def before_forward(self) -> None: ...
    def after_layer(self, i: int) -> None: ...
    def before_backward(self) -> None: ...
    def after_grad(self, i: int) -> None: ...
    def after_backward(self) -> None: ...
    def wait_params(self) -> None: ...

    def inflight(self) -> list:
        return []

    def step(self) -> None:  # the optimizer's: the same update on every rank, no messages
        self.optimizer.step()

    @contextmanager
    def gathered(self):
        yield self.model.params

    def full_optimizer(self):
        return self.optimizer

    def load_optimizer(self, optimizer) -> None:
        self.optimizer.load_state_dict(optimizer.state_dict())

    def close(self) -> None:
        for b in self.buckets:
            if b.plan is not None:
                b.plan.Free()


class ReduceScatter:
    """ZeRO stages 1-3: buckets reduce-scattered, my shard stepped, parameters all-gathered.

    Stage 1 keeps the full gradient buffer (buckets are slices of it, their
    reduce-scatters planned once); stages 2 and 3 make each bucket just before
    backward writes its first unit and free it once its reduce-scatter is done
    (under `no_sync()`, the buckets live until the synced backward).
    """

    collective = "reduce_scatter"

    @staticmethod
    def check(model, optimizer) -> None:
        """Raise before any message if the model or the optimizer cannot be sharded."""
        if optimizer is None:
            raise ValueError("sharded data parallelism updates the parameters itself: "
                             "pass optimizer=SGD(model.params, model.grads, ...) or Adam(...)")
        if len({p.dtype for p in model.params.values()}) != 1:
            raise TypeError("sharded data parallelism needs every parameter in one dtype")

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
                if not deterministic:  # the exact sum of a step's parts: planned at each launch
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

    def start(self, b: Bucket):
        counts = self.layout.blocks[b.index].counts
        if self.deterministic:  # my block at the bucket's front, as the in-place call's
            return exact(self.comm, b, b.flat[:counts[self.comm.Get_rank()]],
                         self.algorithm["reduce_scatter"], counts)
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

    def after_backward(self) -> None:
        self._take_done()  # every launched bucket is done

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
