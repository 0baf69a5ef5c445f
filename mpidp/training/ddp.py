"""Data parallelism: the article's version first, then buckets overlapped with backward.

`NaiveDataParallel` is data parallelism as the article starts from it: every replica
starts from rank 0's weights; after the whole backward pass, each layer's gradients are
averaged across the ranks, one all-reduce per layer, and only then may the optimizer
step. Communication waits for compute, then compute waits for communication.

`DataParallel` keeps the same two steps and removes the wait, as PyTorch DDP does. The
gradients live in a few flat buffers, the buckets (`buckets.py`): whole layers (units of
backward, the model protocol there: the MLP's layers, the GPT's blocks), last first
(backward's order), each closed at ``bucket_mb`` (the first at ``first_bucket_mb``,
so the first all-reduce starts early). The model calls ``on_grad(i)`` after layer i;
when a bucket's last layer is done its all-reduce (average; persistent, planned once at
construction, `mpidp.allreduce_init`) starts, and the ones in flight are advanced with
``test()`` (a schedule moves on only when called into, or by a progress thread; with
``piece_mb`` a layer's gradient goes in pieces, each as backward writes it, `pieces.py`;
docs/overlap.md measures each design). For a
4-layer MLP with one layer per bucket (overlap=True):

    compute | fwd 1..4 | bwd 4 | bwd 3 | bwd 2 | bwd 1 |wait| sgd |
    bucket0 |          |       |== allreduce(W4,b4) ==|
    bucket1 |                  |== allreduce(W3,b3) ====|
    bucket2 |                          |== allreduce(W2,b2) ==|
    bucket3 |                                  |== all... ==|

Every bucket is complete before `backward` returns. All ranks plan and launch the
buckets in the same order, on a duplicate of the user's communicator (never meeting the
user's messages). ``overlap=False`` launches them after backward; under ``no_sync()``
gradients accumulate locally and the next synced backward all-reduces the sum (scale
dlogits by 1/A for A micro-batches).

What happens to a bucket once backward has filled it is the *reducer*'s
(`reducers.py`): an all-reduce of the gradients for ``zero=0``, a reduce-scatter
and a sharded optimizer step for ``zero=1|2|3`` (ZeRO, `zero.py`, `zero3.py`).
This class is the loop every stage shares: hooks, buckets launched in order,
progress, the wait, timings, the progress thread.

N ranks equal one rank on the global batch: the AVG of N ranks' mean gradients over
equal shards is the mean over all N·b samples, up to rounding. ``deterministic=True``
makes it exact: every backward is one micro-shard (`determinism.py`), kept apart under
``no_sync()``, and the synced backward launches per bucket the exact average of all
ranks' micro-shards (`mpidp.iallreduce_parts`), whose bits depend only on the multiset
of addends. Pass each micro-shard's mean-loss gradient as it is (no 1/A).
"""

from __future__ import annotations

import inspect
import threading
import time
from contextlib import contextmanager

from mpi4py import MPI

from .. import collectives as mp
from ..collectives import placement
from ..collectives.algorithms.hosts import spans_hosts
from .buckets import Bucket, make_buckets, units
from .determinism import check_reproducible
from .pieces import PieceSet, plan_pieces
from .reducers import STAGES, AllReduce, ReduceScatter
from .replicas import check_replicas, replicate
from .zero import halves

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
        for _, names in units(self.model):  # ... then communicate, layer by layer
            for name in names:  # a tied weight once, with the last unit that writes it
                mp.allreduce(self.comm, mp.IN_PLACE, self.model.grads[name], op=mp.AVG)


class DataParallel:
    """Wraps a model for data-parallel training on `comm`, buckets overlapped with backward.

    Args:
        model: an `MLP`, a `GPT`: anything with the protocol of `buckets.py` (params,
            grads, layers, names(i), forward with on_layer, backward with on_grad).
        comm: an MPI communicator or `mpidp.Comm` (duplicated: a matching space for the
            buckets; `close` frees it), or any comm-like object (used as given).
        bucket_mb, first_bucket_mb: bucket caps in MiB (PyTorch DDP: 25, 1); 0: one per layer.
        overlap: start each bucket's reduction during backward (False: after it).
        algorithm: an all-reduce name from ``mpidp.ALGORITHMS["allreduce"]``; with ZeRO
            ``"auto"``, ``"ring"``, ``"rabenseifner"`` or ``{"reduce_scatter": name,
            "allgather": name}`` (`zero.halves`).
        progress_thread: also advance the reductions from a background thread:
            ``"poll"`` (or True) tests every bucket each ``progress_interval_s`` and
            sleeps between; ``"wait"`` blocks inside MPI (GIL released) on the current
            round of the oldest bucket in flight, posts its next round, and moves on;
            False, the default: no thread (the reductions advance at the hooks, and
            between the blocks of cut layers; a thread hid no more than the pieces
            across hosts and cost more on one host, docs/overlap.md).
        progress_interval_s: the ``"poll"`` thread's sleep between tests, and the
            ``"wait"`` thread's when the compute thread holds the request it would wait on.
        piece_mb: cut each layer's gradient into pieces of about this many MiB, each
            reduced as soon as backward has written it. ``"auto"``, the default: where
            the comm spans hosts, pieces sized by `pieces.piece_bytes`, and whole
            buckets on one host (there the cut products cost more than they hide;
            across hosts the pieces hide what plain polling cannot, docs/overlap.md);
            None: whole buckets everywhere. Only for stage 0, not deterministic, with
            a model whose backward takes ``blocks`` (the MLP); elsewhere whole
            buckets. The cut layers' backward also gives the reductions a progress
            call between blocks.
        pieces: with `piece_mb`, False keeps the blocks' progress calls but reduces
            whole buckets (what the benchmark compares).
        debug: check after the broadcast that every rank holds the same parameters.
        tracer: a `mpidp.trace.Tracer` that records layers and buckets.
        timeout: seconds `backward` waits for the buckets before TimeoutError (None: no limit).
        optimizer: what `step()` runs (with ZeRO: required, its kind, hyper-parameters
            and state are taken for this rank's shard; step with ``step()``, not it).
        zero: the ZeRO stage, 0 (replicas) .. 3 (`zero.py`, `zero3.py`; stage 3 buckets
            one unit each, whatever ``bucket_mb``).
        prefetch: ZeRO 1, 2: `step()` leaves the parameters' all-gather running into the
            next forward, which waits layer by layer; 3: each unit's all-gather starts
            while the unit before it (forward; after it, backward) runs.
        deterministic: bitwise the result of one rank on the global batch (see above);
            RuntimeError where this process cannot promise it (`determinism.py`).

    Attributes: ``reducer`` (`reducers.py`), ``optimizer`` (with ZeRO the shard's),
    ``progress`` (the thread's design, or None), ``blocks`` (layer -> W's row stops where
    backward is cut, or None), ``across`` (``piece_mb="auto"`` found several hosts), and
    with ZeRO ``layout``, ``grad_shard`` (this rank's averaged gradients), ``param_shard``,
    ``flat_params`` (stages 1, 2: ``model.params`` are views of it; stage 3: they are None
    between steps, see `gathered`).
    """

    def __init__(self, model, comm, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 overlap: bool = True, algorithm="auto", progress_thread: bool | str = False,
                 debug: bool = False, tracer=None, progress_interval_s: float = 1e-4,
                 timeout: float | None = None, *, optimizer=None, zero: int = 0,
                 prefetch: bool = False, deterministic: bool = False,
                 piece_mb: float | str | None = "auto", pieces: bool = True):
        if zero not in STAGES:
            raise ValueError(f"zero must be one of {', '.join(map(str, STAGES))}, not {zero!r}")
        if zero:
            algorithm = halves(algorithm)
        else:
            mp.check_algorithm("allreduce", algorithm)
            if prefetch:
                raise TypeError("prefetch is ZeRO's (the parameters' all-gather): zero >= 1")
        if deterministic:
            check_reproducible(model.xp)
        if progress_thread not in (False, True, "wait", "poll"):
            raise ValueError(f"progress_thread must be False, True, 'wait' or 'poll', "
                             f"not {progress_thread!r}")
        if piece_mb is not None and piece_mb != "auto" and not float(piece_mb) > 0:
            raise ValueError(f"piece_mb must be > 0, 'auto' or None, not {piece_mb!r}")
        for name, p in model.params.items():  # before any message: plain floats only
            mp.check_buffer(p, f"parameter {name!r}", writable=True)
            mp.AVG.check(p.dtype)
        reducer = ReduceScatter if zero else AllReduce
        reducer.check(model, optimizer)
        auto = algorithm == "auto" if not zero else "auto" in algorithm.values()
        self._dup = mp.duplicate(comm, with_model=auto)
        self.comm = comm if self._dup is None else self._dup
        self.model, self.overlap, self.algorithm, self.timeout = model, overlap, algorithm, timeout
        self.zero, self.prefetch, self.deterministic = zero, prefetch, deterministic
        replicate(model, self.comm)
        if debug:
            check_replicas(model.params, self.comm)
        if zero == 3:  # a unit's parameters are gathered, and its gradients reduced, alone
            bucket_mb = first_bucket_mb = 0
        self.buckets = make_buckets(model, bucket_mb * MiB, min(first_bucket_mb, bucket_mb) * MiB)
        self._bucket_of = {i: b for b in self.buckets for i in b.layers}  # completed by unit i
        across = False  # pieces can pay only where a link carries the bytes
        if piece_mb == "auto":  # (a query, collective: only when asked)
            across = self.comm.Get_size() > 1 and isinstance(self.comm, MPI.Intracomm) and \
                spans_hosts(placement.placement(self.comm))
            if not (across and overlap):
                piece_mb = None
        self.across = across
        self.progress = ("poll" if progress_thread is True else progress_thread) or None
        self.blocks, self._pieces = None, {}  # layer -> W's row stops; bucket -> its pieces
        if (piece_mb is not None and not zero and not deterministic
                and "blocks" in inspect.signature(model.backward).parameters):
            # pieces=False: the blocks' progress calls alone, buckets reduced whole
            self.blocks, self._pieces = plan_pieces(model, self.comm, self.buckets, piece_mb,
                                                    algorithm, reduce=pieces)
        whole = {} if zero else {"pieced": frozenset(self._pieces)}  # those plan no whole one
        self.reducer = reducer(model, self.comm, self.buckets, optimizer, algorithm,
                               zero=zero, prefetch=prefetch, deterministic=deterministic,
                               timeout=timeout, **whole)
        self.optimizer = self.reducer.optimizer
        self._sync, self._micro, self._launching = True, 0, False
        self.t_backward = 0.0
        self.timings = {"backward": 0.0, "exposed_comm": 0.0, "rounds_in_backward": 0}
        self.on_layer = None  # forward's per-layer hook (a tracer's)
        self._thread = None
        if progress_thread:
            if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
                raise RuntimeError("progress_thread needs MPI_THREAD_MULTIPLE")
            self._interval, self._stop, self._work = progress_interval_s, False, threading.Event()
            loop = self._poll_loop if self.progress == "poll" else self._wait_loop
            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()
        if tracer is not None:
            tracer.follow(self)

    # what the reducer holds, under the names of the front
    bucket_collective = property(lambda self: self.reducer.collective)  # a trace's bucket row
    layout = property(lambda self: self.reducer.layout)
    grad_shard = property(lambda self: self.reducer.grad_shard)
    flat_params = property(lambda self: self.reducer.params.flat)
    param_shard = property(lambda self: self.reducer.params.shard)

    def check_replicas(self) -> None:
        """Raise RuntimeError unless every rank holds bitwise-identical parameters."""
        with self.gathered() as params:
            check_replicas(params, self.comm)

    def gathered(self):
        """``with ddp.gathered() as params:`` ``model.params`` whole inside (collective)."""
        return self.reducer.gathered()

    def wait_params(self) -> None:
        """Complete the parameters' all-gathers in flight (ZeRO's prefetch)."""
        self.reducer.wait_params()

    def full_optimizer(self):
        """The optimizer with every rank's state, by name (collective): what a checkpoint saves."""
        return self.reducer.full_optimizer()

    def load_optimizer(self, optimizer) -> None:
        """Take the state of `optimizer` (by parameter name, as saved)."""
        self.reducer.load_optimizer(optimizer)

    # ------------------------------------------------------------ training step

    def forward(self, x):
        self.reducer.before_forward()
        return self.model.forward(x, on_layer=self._layer_done)

    def _layer_done(self, i: int) -> None:
        if self.on_layer is not None:
            self.on_layer(i)
        self.reducer.after_layer(i)

    def backward(self, dlogits, timeout: float | None = None) -> None:
        """Backward with bucketed reduction; on return the gradients hold the rank average
        (with ZeRO: ``grad_shard``, my shard of it).

        Inside `no_sync()`, only accumulates: no communication. `timeout` (default:
        the constructor's) bounds the wait for the buckets (TimeoutError).
        """
        sync = self._sync
        self._launching = sync and self.overlap
        t0 = self.t_backward = time.perf_counter()
        for b in self.buckets:
            b.pending, b.request, b.launched = len(b.layers), None, None
        self.reducer.before_backward()
        accumulate = self._micro > 0 and not self.deterministic
        if self.blocks is not None:
            self.model.backward(dlogits, on_grad=self.on_grad, accumulate=accumulate,
                                blocks=self.blocks, on_rows=self.on_rows)
        else:
            self.model.backward(dlogits, on_grad=self.on_grad, accumulate=accumulate)
        t1 = time.perf_counter()
        if not sync:
            if self.deterministic:  # kept apart: added once, exactly, with the others'
                for b in self.buckets:
                    b.parts.append(b.flat.copy())
            self._micro += 1
            self.timings = {"backward": t1 - t0, "exposed_comm": 0.0, "rounds_in_backward": 0}
            return
        # rounds past each bucket's first, completed while backward computed: the overlap
        overlapped = sum(b.request.rounds - 1 for b in self.buckets if b.request is not None)
        for b in self.buckets:  # overlap=False: every bucket starts here, in order
            if b.request is None:
                self._launch(b)
        mp.waitall(self._inflight(), self.timeout if timeout is None else timeout)
        for b in self.buckets:
            b.parts = []
        self._micro = 0
        self.reducer.after_backward()
        self.timings = {"backward": t1 - t0, "exposed_comm": time.perf_counter() - t1,
                        "rounds_in_backward": overlapped}

    def step(self) -> None:
        """The optimizer's update (stage 0: the same on every rank; ZeRO: my shard, then
        the parameters' all-gather)."""
        self.reducer.step()

    @contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, with no reduction."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def on_grad(self, i: int) -> None:
        """Unit i's gradients are written: maybe launch its bucket; progress the others."""
        bucket = self._bucket_of[i]
        bucket.pending -= 1
        if bucket.pending == 0 and self._launching:
            self._launch(bucket)
        mp.testall(self._inflight())
        self.reducer.after_grad(i)

    def on_rows(self, i: int, stop: int | None) -> None:
        """A block of unit i's backward is done (`MLP.backward`'s ``blocks``): start the
        piece it completed, if any (stop: rows of W_i written), and progress."""
        bucket = self._bucket_of[i]
        if stop is not None and self._launching and bucket.index in self._pieces:
            if bucket.request is None:
                self._start_pieces(bucket)
            bucket.request.written(i, stop)
            if self._thread is not None:
                self._work.set()
        mp.testall(self._inflight())

    def _inflight(self) -> list:
        """The requests in flight, oldest first (each piece's on its own)."""
        out = []
        for b in self.buckets:
            if b.request is not None:
                out.extend(b.request.started() if b.index in self._pieces else [b.request])
        return out + self.reducer.inflight()

    def _launch(self, b: Bucket) -> None:
        """Start bucket b's reduction (with pieces: every piece not started yet)."""
        if b.index in self._pieces:
            if b.request is None:
                self._start_pieces(b)
            b.request.start_rest()
        else:
            b.launched = time.perf_counter()
            b.request = self.reducer.start(b)
        if self._thread is not None:
            self._work.set()

    def _start_pieces(self, b: Bucket) -> None:
        """Bucket b's pieces, none started: backward (`on_rows`) or `_launch` starts them."""
        b.request = PieceSet(self._pieces[b.index])

    def _poll_loop(self) -> None:
        """``progress_thread="poll"``: test everything, sleep, again."""
        while not self._stop:
            inflight = self._inflight()
            if inflight and not mp.testall(inflight):
                time.sleep(self._interval)  # let the compute thread have the GIL
            else:
                self._work.wait(0.1)
                self._work.clear()

    def _wait_loop(self) -> None:
        """``progress_thread="wait"``: block in MPI on the oldest request's current round
        (the GIL released: backward's Python runs meanwhile), post its next, repeat."""
        while not self._stop:
            oldest = next((r for r in self._inflight() if not r.done), None)
            if oldest is None:
                self._work.wait(0.1)
                self._work.clear()
            elif not (oldest.wait_round() if hasattr(oldest, "wait_round") else oldest.Test()):
                time.sleep(self._interval)  # the compute thread is advancing it: let it

    # ------------------------------------------------------------ reporting

    def bucket_times(self) -> list[dict]:
        """Each bucket's launch and completion, seconds after the last backward began
        (with pieces: its first piece's launch, its last one's completion, and
        ``pieces``: each piece's launch and completion)."""
        rows = []
        for b in self.buckets:
            if b.request is None or not b.request.done:
                continue
            launched = b.request.launched if b.index in self._pieces else b.launched
            row = {"bucket": b.index, "layers": b.layers, "bytes": self.reducer.nbytes(b),
                   "launch": launched - self.t_backward,
                   "complete": b.request.completed_at - self.t_backward}
            if b.index in self._pieces:
                row["pieces"] = [(t0 - self.t_backward, t1 - self.t_backward)
                                 for t0, t1 in b.request.times()]
            rows.append(row)
        return rows

    def close(self) -> None:
        """Stop the progress thread, if any, and free the buckets' communicator (collective)."""
        if self._thread is not None:
            self._stop = True
            self._work.set()
            self._thread.join(10.0)  # a "wait" thread blocked on a request that never
            self._thread = None  # completes (a timed-out backward) stays, a daemon
        for pieces in self._pieces.values():
            for piece in pieces:
                piece.plan.Free()
        self.reducer.close()
        if self._dup is not None:
            self._dup.Free()  # self.comm is now MPI.COMM_NULL: a later collective raises
            self._dup = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardedDataParallel(DataParallel):
    """`DataParallel` with ``zero=1`` by default (the name stages 1 and 2 were built under)."""

    def __init__(self, model, comm, *args, zero: int = 1, **kw):
        if zero not in STAGES[1:]:
            raise ValueError(f"zero must be 1, 2 or 3 for sharded data parallelism, not {zero!r}")
        super().__init__(model, comm, *args, zero=zero, **kw)
