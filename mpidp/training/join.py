"""Uneven inputs: ``with ddp.join():``, a rank out of batches shadows the ranks still training.

Without it, a rank with one batch fewer than the others leaves them waiting in their
next bucket's reduction until the deadline. Inside ``join()`` (PyTorch's ``Join``), each
rank runs its own loop over its own batches; the ranks agree, before every forward, how
many of them are still training:

    rank 0 (3 steps)   agree | step 1 | agree | step 2 | agree | step 3 | agree: 0, done
    rank 1 (2 steps)   agree | step 1 | agree | step 2 | agree | shadow | agree: 0, done
    rank 2 (1 step)    agree | step 1 | agree | shadow | agree | shadow | agree: 0, done
    training           3               2                1                0

The agreement is one all-reduce (SUM) of four integers per rank: trains (1, 0 once
joined), its backward syncs (not inside ``no_sync()``), a broken promise (below), the
micro-shards of its forward (``ddp.forward(x, micro_shards=K)``; 0 once joined). A rank
whose loop is over keeps calling it; while some rank still trains it shadows that
step: it runs `DataParallel`'s forward, backward and the step function (``step=``,
default ``ddp.step``) on a stand-in of the model (`Shadow`) that computes nothing and
writes zero gradients, so every collective of the step (the buckets' all-reduces,
ZeRO's reduce-scatters and all-gathers, a clipping's norm, a checkpoint in ``step=``)
meets its match, in order. The step runs on the joined ranks too: every replica, and
every ZeRO shard, stays the one the training ranks would have (a shard's owner must
update it, trained or not).

The semantics, per step: the gradient is the average over the T ranks that trained in
it (T <= N), not over N: each bucket's reduction takes zeros from the joined ranks,
then (T < N) is scaled by N/T. With equal per-rank batches of b samples that is the
mean gradient over the T·b samples those ranks saw: one rank on their union. In
deterministic mode the ordered average divides by T·K (K micro-shards a rank this
step) and the joined ranks bring no addends at all, so the result is bitwise one
rank's on those T·K micro-shards, taken rank by rank. A step with T = N runs exactly
as without ``join()``.

The promises (each broken one is a RuntimeError on every rank, never a hang): the
ranks that train run the same number of micro-batches per step (they agree on
``no_sync()`` at every forward, so ``no_sync()`` must hold the forward as well as the
backward), and a rank leaves its loop only between steps (not with accumulated
micro-batches whose samples would be lost). Collectives of your own inside the loop
(a loss all-reduce) are not shadowed: put them in ``step=`` or after the block.

Cost: one all-reduce of 4 integers per forward (``recursive_doubling``: about log N rounds),
and on a joined rank the step's communication with no compute.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

from .. import collectives as mp

TRAINS, SYNCS, BROKEN, SHARDS = 0, 1, 2, 3  # the agreement's fields


class Shadow:
    """A stand-in for a model on a joined rank: the protocol's hooks, no compute.

    ``forward`` calls ``on_layer(i)`` for i = 1 .. U; ``backward`` writes zeros into
    unit i's gradients and calls ``on_grad(i)``, i = U .. 1 (ZeRO's buckets and
    gathers come and go at those hooks as in a real step). The rest is the model's.
    """

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, x, on_layer: Callable[[int], None] | None = None) -> None:
        for i in range(1, self.model.layers + 1):
            if on_layer is not None:
                on_layer(i)

    def backward(self, dlogits, on_grad: Callable[[int], None] | None = None,
                 accumulate: bool = False, **cut) -> None:
        for i in range(self.model.layers, 0, -1):
            for name in self.model.names(i):
                self.model.grads[name][...] = 0
            if on_grad is not None:
                on_grad(i)


class Joining:
    """The reducer of a `DataParallel` inside ``join()``: the one it had, plus the agreement
    before each forward and the rescaling after each synced backward."""

    def __init__(self, inner, ddp):
        self.inner, self.ddp = inner, ddp
        self.shadowing = False  # this rank's loop is over: its forwards agree no more
        self.trained, self.synced = 0, True  # the last agreement's
        self.shards = 0  # the training ranks' micro-shards since the last synced backward
        self.size = ddp.comm.Get_size()

    def __getattr__(self, name):  # everything else is the reducer's
        return getattr(self.inner, name)

    def agree(self, trains: bool, broken: bool = False) -> tuple[int, bool]:
        """The ranks still training and whether their backward syncs (collective)."""
        mine = np.array([trains, trains and self.ddp._sync, broken,
                         trains and self.ddp.apart.k], dtype=np.int64)
        mp.allreduce(self.ddp.comm, mp.IN_PLACE, mine, op=mp.SUM,
                     algorithm="recursive_doubling")
        trained, syncs, broken, shards = (int(v) for v in mine)
        if broken:
            raise RuntimeError(f"join(): {broken} rank(s) left the loop with no_sync() "
                               "micro-batches not yet reduced: leave it between steps only")
        if syncs not in (0, trained):
            raise RuntimeError(f"join(): of the {trained} ranks training, {syncs} sync this "
                               "backward and the others are inside no_sync(): every rank "
                               "must run the same micro-batches per step (no_sync() around "
                               "forward and backward)")
        self.trained, self.synced = trained, bool(syncs)
        self.shards = self.shards + shards if self.trained else 0
        if self.synced and self.inner.deterministic and 0 < trained < self.size:
            # the training ranks' micro-shards: the ordered average's addends; mine if I train
            self.inner.uneven = (self.shards, bool(trains))
        else:
            self.inner.uneven = None
        return trained, self.synced

    def before_forward(self) -> None:
        if not self.shadowing:
            self.agree(True)
        self.inner.before_forward()

    def after_backward(self, synced: bool) -> None:
        if synced != self.synced:
            raise RuntimeError("join(): no_sync() must hold the forward too: the ranks agree "
                               "at forward whether the backward syncs")
        self.inner.after_backward(synced)
        if not synced:
            return
        self.shards = 0
        if self.trained < self.size and not self.inner.deterministic:
            scale = self.size / self.trained  # the AVG divided by N: T trained
            grads = ([self.inner.grad_shard] if self.ddp.zero else
                     [b.flat for b in self.inner.buckets])
            for g in grads:
                g *= g.dtype.type(scale)


class Join:
    """``with ddp.join(step=None):`` around a rank's own loop over its batches (module doc).

    Args:
        ddp: the `DataParallel`.
        step: what each rank runs after a synced backward (an optimizer step, a clipping,
            a checkpoint: every collective in it is matched on the joined ranks); default
            ``ddp.step``. It must not depend on this rank's data.
    """

    def __init__(self, ddp, step: Callable[[], object] | None = None):
        if getattr(ddp.reducer, "hook", None) is not None:
            raise ValueError("join(): not with a communication hook (comm_hook=): a joined "
                             "rank's zero gradients would carry its hook's error feedback")
        if step is None and ddp.optimizer is None:
            raise ValueError("join(): a joined rank steps too, to keep its replica: pass "
                             "optimizer= to DataParallel, or join(step=your_step)")
        self.ddp, self.step = ddp, step or ddp.step
        self.reducer = None

    def __enter__(self) -> Join:
        if isinstance(self.ddp.reducer, Joining):
            raise RuntimeError("join(): already inside a join() of this DataParallel")
        self.reducer = self.ddp.reducer = Joining(self.ddp.reducer, self.ddp)
        return self

    def __exit__(self, kind, value, tb) -> None:
        ddp = self.ddp
        try:
            if kind is None:  # an exception ends the job instead (the others are cut off)
                self.shadow()
        finally:
            ddp.reducer = self.reducer.inner
            self.reducer.inner.uneven = None

    def shadow(self) -> None:
        """Shadow every step of the ranks still training, until none is (collective)."""
        ddp, reducer, model = self.ddp, self.reducer, self.ddp.model
        broken = ddp._micro > 0  # no_sync() backwards whose gradients nobody reduced
        reducer.shadowing, ddp.model = True, Shadow(model)
        try:
            while True:
                trained, synced = reducer.agree(False, broken)
                if not trained:
                    return
                with nullcontext() if synced else ddp.no_sync():
                    ddp.forward(None)
                    ddp.backward(None)
                if synced:
                    self.step()
        finally:
            ddp.model = model


def join(ddp, step: Callable[[], object] | None = None) -> Join:
    """``with ddp.join():`` around a rank's loop over its own, maybe fewer, batches (`Join`)."""
    return Join(ddp, step)
