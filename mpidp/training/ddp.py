"""Data parallelism: the article's version first, then buckets overlapped with backward.

`NaiveDataParallel` is data parallelism as the article starts from it: every replica
starts from rank 0's weights; after the whole backward pass, each layer's gradients are
averaged across the ranks, one all-reduce per layer, and only then may the optimizer
step. Communication waits for compute, then compute waits for communication.

`DataParallel` keeps the same two steps and removes the wait, as PyTorch DDP does. The
gradients live in a few flat buffers, the buckets (`buckets.py`): whole units of
backward (`protocol.py`: the MLP's layers, the GPT's blocks), last first (backward's
order), each closed at ``bucket_mb`` (the first at ``first_bucket_mb``, so the first
reduction starts early). The model calls ``on_grad(i)`` after unit i; when a bucket's
last unit is done its reduction starts, and the ones in flight are advanced with
``test()`` (a schedule moves on only when called into). For a 4-layer MLP with one
layer per bucket (overlap=True):

    compute | fwd 1..4 | bwd 4 | bwd 3 | bwd 2 | bwd 1 |wait| sgd |
    bucket0 |          |       |== allreduce(W4,b4) ==|
    bucket1 |                  |== allreduce(W3,b3) ====|
    bucket2 |                          |== allreduce(W2,b2) ==|
    bucket3 |                                  |== all... ==|

Every bucket is complete before `backward` returns. All ranks plan and launch the
buckets in the same order, on a duplicate of the user's communicator (never meeting the
user's messages). ``overlap=False`` launches them after backward; under ``no_sync()``
gradients accumulate locally and the next synced backward reduces the sum (scale
dlogits by 1/A for A micro-batches).

Each optimisation has a home of its own, and this class only calls it: what a
bucket's reduction is (all-reduce, whole or in pieces; ZeRO's reduce-scatter; the
ordered sum of deterministic mode) is the *reducer*'s (`reducers.py`, `sharded.py`,
`pieces.py`, `determinism.py`); a bucket's ``request`` is always one `Reduction`; a
progress thread is `polling.py`'s; uneven inputs (``join()``) are `join.py`'s.

N ranks equal one rank on the global batch: the AVG of N ranks' mean gradients over
equal shards is the mean over all N·b samples, up to rounding. ``deterministic=True``
makes it bitwise: every backward is one micro-shard (`determinism.py`), kept apart
under ``no_sync()``, and the synced backward launches per bucket the ordered average of
all ranks' micro-shards (rank 0's in order, then rank 1's, ...: the global batch's
order, whatever N), whose bits depend only on that sequence of addends. Pass each
micro-shard's mean-loss gradient as it is (no 1/A). ``forward(x, micro_shards=K)``
takes K of them side by side in one forward and one backward, with the same bits
(a model that keeps them apart, `protocol.py`'s ``part_grads``; not ZeRO 2, 3, whose
buckets are made during backward): the K backward passes' compute in one.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from .. import collectives as mp
from . import hooks, pieces, polling
from . import join as uneven_inputs
from .buckets import Bucket, make_buckets, times, units
from .determinism import SideBySide, check_reproducible
from .reducers import STAGES, AllReduce
from .replicas import check_replicas, replicate
from .sharded import ReduceScatter

MiB = 1 << 20


class NaiveDataParallel:
    """The article's DP: backward, then one averaging all-reduce per layer's gradients."""

    def __init__(self, model, comm):
        self.model, self.comm = model, comm
        replicate(model, comm)

    def forward(self, x):
        return self.model.forward(x)

    def backward(self, dlogits) -> None:
        self.model.backward(dlogits)  # compute first ...
        for _, names in units(self.model):  # ... then communicate, unit by unit
            for name in names:  # a tied weight once, with the last unit that writes it
                mp.allreduce(self.comm, mp.IN_PLACE, self.model.grads[name], op=mp.AVG)


def checked(model, zero, optimizer, algorithm, prefetch, deterministic, progress_thread,
            piece_mb, comm_hook):
    """`DataParallel`'s arguments checked before any message: (the reducer's class, the
    algorithm's name(s), the progress thread's design or None, the hook or None)."""
    if zero not in STAGES:
        raise ValueError(f"zero must be one of {', '.join(map(str, STAGES))}, not {zero!r}")
    reducer = ReduceScatter if zero else AllReduce
    algorithm = reducer.check(model, optimizer, algorithm, prefetch)
    thread = polling.kind(progress_thread)
    pieces.check(piece_mb)
    if deterministic:
        check_reproducible(model.xp)
    for name, p in model.params.items():  # plain floats only
        mp.check_buffer(p, f"parameter {name!r}", writable=True)
        mp.AVG.check(p.dtype)
    return reducer, algorithm, thread, hooks.check(comm_hook, zero, deterministic, model, thread)


class DataParallel:
    """Wraps a model for data-parallel training on `comm`, buckets overlapped with backward.

    Args:
        model: anything with the protocol of `protocol.py` (an `MLP`, a `GPT`).
        comm: an MPI communicator or `mpidp.Comm` (duplicated: a matching space for the
            buckets; `close` frees it), or any comm-like object (used as given).
        bucket_mb, first_bucket_mb: bucket caps in MiB (PyTorch DDP: 25, 1); 0: one per unit.
        overlap: start each bucket's reduction during backward (False: after it).
        algorithm: an all-reduce of ``mpidp.ALGORITHMS["allreduce"]``; with ZeRO "auto",
            "ring", "rabenseifner" or ``{"reduce_scatter": name, "allgather": name}``.
        progress_thread: False (reductions advance at backward's hooks), ``"poll"`` (or
            True) or ``"wait"``: a `polling.ProgressThread` as well.
        timeout: seconds `backward` waits for the buckets before TimeoutError (None: no limit).
        optimizer: what `step()` runs (with ZeRO: required, and taken for this rank's shard).
        zero: the ZeRO stage, 0 (replicas) .. 3 (`sharded.py`; 3: one unit per bucket).
        prefetch: ZeRO 1, 2: `step()` leaves the parameters' all-gather running into the
            next forward; 3: each unit's all-gather starts while the unit before it runs.
        deterministic: bitwise one rank on the global batch (above; `determinism.py` refuses).
        piece_mb: MiB of the pieces reduced as backward writes them (`pieces.py`; stage 0,
            rows cut); "auto": across hosts only; None: whole; `RowsOnly(mb)`: the cut alone.
        comm_hook: each bucket's reduction, whole (`hooks.py`: the protocol; a hook, or
            ``"fp16"``, ``"bf16"``, ``"powersgd:R"``); None: the plain all-reduce.

    Attributes: ``buckets``, ``reducer``, ``optimizer`` (ZeRO: the shard's), ``thread``,
    ``row_stops`` (unit -> W's row stops where backward is cut), ``across`` (``piece_mb="auto"``
    found several hosts); ZeRO's ``layout``, ``grad_shard``, ``param_shard``.
    """

    def __init__(self, model, comm, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 overlap: bool = True, algorithm="auto", progress_thread: bool | str = False,
                 timeout: float | None = None, *, optimizer=None, zero: int = 0,
                 prefetch: bool = False, deterministic: bool = False,
                 piece_mb: float | str | None = "auto", comm_hook=None):
        reducer, algorithm, thread, hook = checked(
            model, zero, optimizer, algorithm, prefetch, deterministic, progress_thread,
            piece_mb, comm_hook)
        names = algorithm.values() if isinstance(algorithm, dict) else [algorithm]
        self._dup = mp.duplicate(comm, with_model="auto" in names)
        self.comm = comm if self._dup is None else self._dup
        self.model, self.overlap, self.timeout, self.zero = model, overlap, timeout, zero
        self.deterministic, self.apart = deterministic, SideBySide(self)  # micro-shards apart
        replicate(model, self.comm)
        if zero == 3:  # a unit's parameters are gathered, and its gradients reduced, alone
            bucket_mb = first_bucket_mb = 0
        self.buckets = make_buckets(model, bucket_mb * MiB, min(first_bucket_mb, bucket_mb) * MiB)
        self._bucket_of = {i: b for b in self.buckets for i in b.units}  # completed by unit i
        extra = ({"zero": zero, "prefetch": prefetch, "timeout": timeout} if zero else
                 {"piece_mb": piece_mb, "overlap": overlap, "hook": hook})
        self.reducer = reducer(model, self.comm, self.buckets, optimizer, algorithm,
                               deterministic=deterministic, **extra)
        self.optimizer = self.reducer.optimizer
        self._sync, self._micro, self._launching, self.t_backward = True, 0, False, 0.0
        self.timings = {"backward": 0.0, "exposed_comm": 0.0, "rounds_in_backward": 0}
        self.on_layer = None  # forward's per-unit hook (a tracer's)
        self.thread = None if thread is None else polling.ProgressThread(thread, self._inflight)

    # what the reducer holds, under the names of the front
    row_stops = property(lambda self: self.reducer.row_stops)
    across = property(lambda self: self.reducer.across)
    bucket_collective = property(lambda self: self.reducer.collective)  # a trace's bucket row
    layout = property(lambda self: self.reducer.layout)
    grad_shard = property(lambda self: self.reducer.grad_shard)
    param_shard = property(lambda self: self.reducer.params.shard)

    parts_bytes = property(lambda self: self.apart.nbytes)  # micro-shards' parts kept

    def check_replicas(self) -> None:
        """Raise RuntimeError unless every rank holds bitwise-identical parameters."""
        with self.gathered() as params:
            check_replicas(params, self.comm)

    # the reducer's, as they are: ``with ddp.gathered() as params:`` model.params whole inside;
    # every rank's optimizer state by name (what a checkpoint saves; both collective); ZeRO's
    # prefetched all-gathers completed; a saved state taken
    gathered = property(lambda self: self.reducer.gathered)
    full_optimizer = property(lambda self: self.reducer.full_optimizer)
    wait_params = property(lambda self: self.reducer.wait_params)
    load_optimizer = property(lambda self: self.reducer.load_optimizer)

    # ------------------------------------------------------------ training step

    def forward(self, x, micro_shards: int = 1):
        """The model's forward; ``micro_shards=K``: x is K micro-shards side by side, kept
        apart by backward, bitwise K backward passes (deterministic, `SideBySide`)."""
        apart = self.apart.forward_args(x, micro_shards)
        self.reducer.before_forward()
        return self.model.forward(x, on_layer=self._layer_done, **apart)

    def _layer_done(self, i: int) -> None:
        if self.on_layer is not None:
            self.on_layer(i)
        self.reducer.after_layer(i)

    def backward(self, dlogits, timeout: float | None = None) -> None:
        """Backward with bucketed reduction; on return the gradients hold the rank average
        (with ZeRO: ``grad_shard``, my shard of it). Inside `no_sync()`, only accumulates:
        no communication. `timeout` (default: the constructor's) bounds the wait for the
        buckets (TimeoutError)."""
        sync = self._sync
        self._launching = sync and self.overlap
        t0 = self.t_backward = time.perf_counter()
        for b in self.buckets:
            b.pending, b.request = len(b.units), None
        self.reducer.before_backward()
        cut = {} if self.row_stops is None else {"row_stops": self.row_stops,
                                                  "on_rows": self.on_rows}
        cut.update(self.apart.backward_args())  # each micro-shard's gradient a part
        self.model.backward(dlogits, on_grad=self.on_grad,
                            accumulate=self.reducer.accumulate(self._micro), **cut)
        t1 = time.perf_counter()
        if not sync:
            self.reducer.after_backward(synced=False)
            self._micro += 1
            self.timings = {"backward": t1 - t0, "exposed_comm": 0.0, "rounds_in_backward": 0}
            return
        # rounds past each bucket's first, completed while backward computed: the overlap
        overlapped = sum(b.request.rounds - 1 for b in self.buckets if b.request is not None)
        for b in self.buckets:  # overlap=False: every bucket starts here, in order
            if b.request is None:
                self.launch(b)
        mp.waitall(self._inflight(), self.timeout if timeout is None else timeout)
        self._micro = 0
        self.reducer.after_backward(synced=True)
        self.timings = {"backward": t1 - t0, "exposed_comm": time.perf_counter() - t1,
                        "rounds_in_backward": overlapped}

    def step(self) -> None:
        """The optimizer's update (ZeRO: my shard, then the parameters' all-gather)."""
        self.reducer.step()

    @contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, with no reduction."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    join = uneven_inputs.join  # ``with ddp.join():`` a rank out of batches shadows the rest

    def on_grad(self, i: int) -> None:
        """Unit i's gradients are written: maybe launch its bucket; progress the others."""
        bucket = self._bucket_of[i]
        bucket.pending -= 1
        if bucket.pending == 0 and self._launching:
            self.launch(bucket)
        mp.testall(self._inflight())
        self.reducer.after_grad(i)

    def on_rows(self, i: int, stop: int | None) -> None:
        """A slice of unit i's backward is done (stop: rows of W_i written, None: a slice
        of dx): start the reduction's parts it completed, if any, and progress."""
        if stop is not None and self._launching:
            self._reduction(self._bucket_of[i]).written(i, stop)
            self._kick()
        mp.testall(self._inflight())

    def launch(self, b: Bucket) -> None:
        """Start bucket b's reduction (every part of it not started yet)."""
        self._reduction(b).start()
        self._kick()

    def _reduction(self, b: Bucket):
        if b.request is None:
            b.request = self.reducer.reduction(b)
        return b.request

    def _kick(self) -> None:
        if self.thread is not None:
            self.thread.kick()

    def _inflight(self) -> list:
        """The requests in flight, oldest first (each part's on its own)."""
        started = [r for b in self.buckets if b.request is not None for r in b.request.requests]
        return started + self.reducer.inflight()

    # ------------------------------------------------------------ reporting

    def bucket_times(self) -> list[dict]:
        """Each reduced bucket's launch and completion since the last backward (`buckets.times`)."""
        return times(self.buckets, self.reducer.nbytes, self.t_backward)

    def close(self) -> None:
        """Stop the progress thread, if any, and free the buckets' communicator (collective)."""
        if self.thread is not None:
            self.thread.close()
            self.thread = None
        self.reducer.close()
        if self._dup is not None:
            self._dup.Free()  # self.comm is now MPI.COMM_NULL: a later collective raises
            self._dup = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
