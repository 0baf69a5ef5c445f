"""ZeRO stage 3: the parameters sharded too, each unit's gathered just before it runs.

Stages 1 and 2 (`zero.py`) shard the optimizer state and the gradients; every rank
still holds every parameter. Stage 3 (ZeRO-3, PyTorch FSDP) shards the parameters
as well. Each unit (an MLP layer, a GPT block: `buckets.py`'s protocol) has its
own bucket, cut into N blocks (`shards.Layout(each=True)`, FSDP's flat parameter
per unit); rank r keeps block r of every unit and nothing else between steps:

                 rank 0           rank 1           rank 2           rank 3
    stage 3   P █···           P ·█··           P ··█·           P ···█
              G █··· S █···    G ·█·· S ·█··    G ··█· S ··█·    G ···█ S ···█   (P + G + K·P)/N

One step on rank r, N = 4, three units (each row: what runs, what is gathered):

    forward  L1   all-gather L1 (wait) | compute L1 | free L1
    forward  L2   all-gather L2 (wait) | compute L2 | free L2         prefetch: L3's
    forward  L3   all-gather L3 (wait) | compute L3 | free L3         gather starts here
    backward L3   all-gather L3 (wait) | compute L3 | reduce-scatter dL3, free L3
    backward L2   all-gather L2 (wait) | compute L2 | reduce-scatter dL2, free L2
    backward L1   all-gather L1 (wait) | compute L1 | reduce-scatter dL1, free L1
    step()        my block of every unit updated: no message

``prefetch=True`` starts the next unit's all-gather (forward: k+1, backward: k-1) as
unit k begins, so that it is in flight while unit k computes (FSDP's forward and
backward prefetch); it advances only when polled (`DataParallel`'s progress). A unit
that reads another's parameter (the GPT's head reads the token embedding, unit 1's)
gathers that unit's too. The model's backward must not keep a gathered parameter in
its cache (the MLP reads ``W`` from ``params`` again in backward): what is freed is
then freed.

Cost per step, per rank, G bytes of parameters (= gradients), N dividing every unit,
A micro-batches (each forward and backward gathers again; one reduce-scatter):

    all-gathers      2A · ((N-1)α per unit + G(N-1)/N·β)
    reduce-scatter   (N-1)α per unit + G(N-1)/N·β + G(N-1)/N·γ
    in all           (2A + 1)·G·(N-1)/N bytes: 3·G·(N-1)/N without accumulation,
                     the ZeRO paper's 3Ψ against stage 0-2's 2Ψ

Reference: Rajbhandari et al., "ZeRO" (SC 2020), section 5.3; Zhao et al., "PyTorch
FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023).
"""

from __future__ import annotations

from contextlib import contextmanager

from .. import collectives as mp
from .buckets import writers


class GatherPerUnit:
    """Stage 3's parameters: my block of every unit, each unit gathered only while it runs.

    Between steps ``model.params`` entries are None and ``shard`` (my blocks, bucket
    order) is all this rank holds; the optimizer updates it in place.
    """

    def __init__(self, model, comm, buckets, layout, algorithm: str, prefetch: bool, timeout):
        self.model, self.comm, self.buckets, self.layout = model, comm, buckets, layout
        self.algorithm, self.prefetch, self.timeout = algorithm, prefetch, timeout
        self.dtype = next(iter(model.params.values())).dtype
        self.shard = layout.shard_of(layout.flatten(model.params, model.xp, self.dtype))
        for name in model.params:  # the whole parameters go: what the rank keeps is its shard
            model.params[name] = None
        # unit i -> the buckets (units) whose parameters it reads
        self._needs = {i: [b.index for b in bs] for i, bs in writers(model, buckets).items()}
        self._full = [None] * len(buckets)  # bucket k's gathered parameters, or None
        self._requests = [None] * len(buckets)  # its all-gather in flight, or None

    # ------------------------------------------------------------ one unit's parameters

    def _fetch(self, k: int) -> None:
        """Start bucket k's all-gather into a new buffer, my block copied in (if not held)."""
        if self._full[k] is not None:
            return
        start, stop = self.layout.ranges[k]
        in_bucket, in_shard, count = self.layout.mine(k)
        full = self.model.xp.empty(stop - start, dtype=self.dtype)
        full[in_bucket:in_bucket + count] = self.shard[in_shard:in_shard + count]
        self._full[k] = full
        self._requests[k] = mp.iallgather(self.comm, mp.IN_PLACE, full,
                                          self.layout.blocks[k].counts,
                                          algorithm=self.algorithm)

    def _ready(self, k: int) -> None:
        """Bucket k's parameters whole: gathered (waited for) and ``model.params`` views of them."""
        self._fetch(k)
        self._complete(k)
        start = self.layout.ranges[k][0]
        self.model.params.update(self.layout.views(self._full[k], self.buckets[k].names, at=start))

    def _complete(self, k: int) -> None:
        if self._requests[k] is not None:
            mp.waitall([self._requests[k]], self.timeout)
            self._requests[k] = None

    def _release(self, k: int) -> None:
        """Free bucket k's gathered parameters (after its all-gather: MPI may still write)."""
        self._complete(k)
        self._full[k] = None
        for name in self.buckets[k].names:
            self.model.params[name] = None

    def _enter(self, i: int, after: int | None) -> None:
        """Unit i runs now, unit `after` next (None: none): gather i's, maybe start after's."""
        for k in self._needs[i]:
            self._ready(k)
        if self.prefetch and after is not None:
            for k in self._needs[after]:
                self._fetch(k)

    def _leave(self, i: int, after: int | None) -> None:
        """Unit i is done: free what it read, unless unit `after` reads it too."""
        keep = self._needs[after] if after is not None else ()
        for k in self._needs[i]:
            if k not in keep:
                self._release(k)

    # ------------------------------------------------------------ the step's hooks

    def before_forward(self) -> None:
        U = self.model.layers
        self._enter(1, 2 if U > 1 else None)

    def after_layer(self, i: int) -> None:
        U = self.model.layers
        self._leave(i, i + 1 if i < U else None)
        if i < U:
            self._enter(i + 1, i + 2 if i + 1 < U else None)

    def before_backward(self) -> None:
        U = self.model.layers
        self._enter(U, U - 1 if U > 1 else None)

    def after_grad(self, i: int) -> None:
        self._leave(i, i - 1 if i > 1 else None)
        if i > 1:
            self._enter(i - 1, i - 2 if i > 2 else None)

    def after_step(self) -> None: ...  # nothing to gather: each unit is gathered when it runs

    def inflight(self) -> list:
        return [r for r in self._requests if r is not None]

    def held(self) -> list:
        """The parameter arrays this rank keeps now: its shard, and what is gathered."""
        return [self.shard, *(f for f in self._full if f is not None)]

    def wait(self) -> None:
        for k in range(len(self.buckets)):
            self._complete(k)

    @contextmanager
    def gathered(self):
        """Every unit's parameters whole in ``model.params`` inside (collective), freed after."""
        for k in range(len(self.buckets)):
            self._ready(k)
        try:
            yield self.model.params
        finally:
            for k in range(len(self.buckets)):
                self._release(k)

    def close(self) -> None:
        self.wait()
