"""Gradient reducers: what `DataParallel` does with a bucket once backward has filled it.

`DataParallel` (ddp.py) runs the loop every stage shares: the model's hooks, the
buckets launched in order as backward completes them, progress, the wait. What a
bucket's reduction is, and what `step()` then does, is the reducer's:

    AllReduce       stage 0: each bucket all-reduced (average), whole or in pieces
                    (`pieces.py`); every rank then runs the same optimizer step
    ReduceScatter   stages 1-3 (ZeRO, `sharded.py`): each bucket reduce-scattered, my
                    block kept as my gradient shard; the optimizer steps my shard only;
                    the parameters come back by all-gather, from `zero.GatherAfterStep`
                    (stages 1, 2: after the step) or `zero3.GatherPerUnit` (stage 3:
                    just in time)

Deterministic mode is the reducer's too (`determinism.keep_apart`, `average_parts`). The
protocol, in a step's order (every method called on every rank alike):

    check(model, optimizer, algorithm, prefetch) -> algorithm   before any message
    before_forward(), after_layer(i)       forward: before unit 1, after unit i
    accumulate(micro) -> bool              does backward add to the gradients
    row_stops                              unit -> W's row stops to cut backward at, or None
    before_backward()                      before the model's backward
    reduction(b) -> Reduction              bucket b's reduction in this backward
    after_grad(i)                          unit i's gradients are written (and maybe launched)
    after_backward(synced)                 the backward is done (synced: so is every reduction)
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
from . import hooks, pieces
from .buckets import Bucket, Reduction
from .determinism import average_parts, keep_apart

STAGES = (0, 1, 2, 3)


class AllReduce:
    """Stage 0: every bucket all-reduced (persistent, planned once); every rank steps alike.

    Where the model's backward can be cut by rows, buckets may go in pieces
    (`pieces.cut`): ``row_stops`` (unit -> W's row stops) and ``pieces`` (bucket
    index -> its pieces); ``across``: the ranks span hosts (``piece_mb="auto"`` asked).
    With a communication hook (`hooks.py`) each bucket's reduction is the hook's, whole.
    """

    collective = "allreduce"
    splits_shards = True  # deterministic mode's micro-shards side by side (ddp.forward)
    uneven = None  # set by `join.Joining` for a step some ranks sat out (`average_parts`)

    @staticmethod
    def check(model, optimizer, algorithm, prefetch: bool):
        """Raise before any message on a bad all-reduce name or ZeRO's prefetch."""
        mp.check_algorithm("allreduce", algorithm)
        if prefetch:
            raise TypeError("prefetch is ZeRO's (the parameters' all-gather): zero >= 1")
        return algorithm

    def __init__(self, model, comm, buckets, optimizer, algorithm: str, *,
                 deterministic: bool = False, piece_mb=None, overlap: bool = True,
                 hook=None):
        self.model, self.comm, self.buckets, self.optimizer = model, comm, buckets, optimizer
        self.algorithm, self.deterministic, self.hook = algorithm, deterministic, hook
        self.row_stops, self.pieces, self.across = None, {}, False
        if hook is not None:  # the hook's reduction replaces the bucket's all-reduce
            self.hooked = hooks.grad_buckets(model, buckets, algorithm)
            return
        if not deterministic:  # a cut product may round differently: never in this mode
            self.row_stops, self.pieces, self.across = pieces.cut(
                model, comm, buckets, piece_mb, algorithm, overlap)
        for b in buckets:  # planned once: each step only starts them
            # (deterministic: the ordered sum of a step's parts, `average_parts`;
            # buckets in pieces go piece by piece, never whole)
            if not deterministic and b.index not in self.pieces:
                b.plan = mp.allreduce_init(comm, mp.IN_PLACE, b.flat, op=mp.AVG,
                                           algorithm=algorithm)

    def accumulate(self, micro: int) -> bool:
        return micro > 0 and not self.deterministic  # deterministic: each micro-shard apart

    def reduction(self, b: Bucket) -> Reduction:
        if self.hook is not None:
            return Reduction([lambda: self.hook(self.comm, self.hooked[b.index])])
        if b.index in self.pieces:
            return pieces.reduction(self.pieces[b.index])
        if self.deterministic:
            return Reduction([lambda: average_parts(self.comm, b, b.flat, self.algorithm,
                                                    uneven=self.uneven, fixed=True)])
        return Reduction([lambda: self._start(b)])

    def _start(self, b: Bucket):
        b.plan.Start()
        return b.plan.request

    def nbytes(self, b: Bucket) -> int:
        return int(b.flat.nbytes)

    # every rank holds every parameter and gradient: nothing to do around the units
    def before_forward(self) -> None: ...
    def after_layer(self, i: int) -> None: ...
    def before_backward(self) -> None: ...
    def after_grad(self, i: int) -> None: ...
    def wait_params(self) -> None: ...

    def after_backward(self, synced: bool) -> None:
        if self.deterministic:
            keep_apart(self.buckets, synced)

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
        if getattr(self.hook, "close", None) is not None:
            self.hook.close()
        for b in self.buckets:
            if b.plan is not None:
                b.plan.Free()
        for planned in self.pieces.values():
            for piece in planned:
                piece.plan.Free()
