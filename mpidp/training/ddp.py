"""DataParallel: identical replicas, bucketed gradient all-reduce overlapped with backward.

At construction rank 0's parameters are broadcast, so every replica starts the
same. The gradients then live in a few flat buffers, the buckets, and
``model.grads[name]`` are views into them (PyTorch DDP's gradient_as_bucket_view):
backward writes each gradient straight into the buffer that is all-reduced.

Buckets hold whole layers in the order backward produces them, last layer
first, each closed once it reaches ``bucket_mb`` (the first one at
``first_bucket_mb``, small, so the first all-reduce starts early). For a 4-layer
MLP with one layer per bucket, the step looks like this (overlap=True):

    compute | fwd 1..4 | bwd 4 | bwd 3 | bwd 2 | bwd 1 |wait| sgd |
    bucket0 |          |       |== allreduce(W4,b4) ==|
    bucket1 |                  |== allreduce(W3,b3) ====|
    bucket2 |                          |== allreduce(W2,b2) ==|
    bucket3 |                                  |== all... ==|

A bucket's nonblocking all-reduce (average) starts when its last gradient is
written (the model calls ``on_grad(i)`` after layer i); between layers the
handles in flight are advanced with ``test()``, since MPI moves a schedule's
next round only when someone calls into it. An optional background thread polls
them too. Every bucket is complete before `backward` returns; only then may the
optimizer step. All ranks launch the buckets in the same order; bucket k uses
its own tag, ``TAG_BASE + 1 + k``, so buckets in flight together never mix, on a
duplicate of the user's communicator, so they never mix with the user's messages.

``overlap=False`` is the serial baseline: backward first, then one all-reduce
per bucket. ``no_sync()`` accumulates micro-batch gradients locally; the next
synced backward adds its own and all-reduces the sum. With a mean loss per
micro-batch, scale dlogits by 1/A (A micro-batches per step) to get the mean over
the A·b samples, as PyTorch users divide the loss by the accumulation steps.

Why N ranks equal one rank on the global batch: each rank's gradient is the mean
over its b samples; the AVG of N such means over equal shards is the mean over
all N·b samples, which is the 1-rank gradient (up to summation order).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from ..collectives import api, cost
from ..collectives.buffers import ScratchPool, as_host
from ..collectives.comm import Comm
from ..collectives.ops import AVG
from ..collectives.schedule import Handle

MiB = 1 << 20


class Bucket:
    """Layers whose gradients share one flat buffer and one all-reduce."""

    __slots__ = ("index", "layers", "names", "flat", "pending", "handle", "launched",
                 "completed")

    def __init__(self, index: int, layers: list[int], names: list[str], flat):
        self.index, self.layers, self.names, self.flat = index, layers, names, flat
        self.pending = len(layers)  # layers whose gradients are not written yet
        self.handle: Handle | None = None
        self.launched = self.completed = None  # perf_counter times of the last sync

    @property
    def tag(self) -> int:
        return api.TAG_BASE + 1 + self.index % (api.TAG_SPAN - 1)


class DataParallel:
    """Wraps an `MLP` for data-parallel training on `comm`.

    Args:
        model: an `MLP` (anything with params, grads, layers, names(i), forward, backward).
        comm: an MPI communicator or `mpidp.Comm` (duplicated: the buckets get their own
            matching space; `close` frees it), or any object with its point-to-point
            methods (used as given).
        bucket_mb, first_bucket_mb: bucket caps in MiB (PyTorch DDP: 25 and 1);
            0 puts every layer in a bucket of its own.
        overlap: start each bucket's all-reduce during backward (False: after it).
        algorithm: an all-reduce name from ``mpidp.ALGORITHMS["allreduce"]``.
        progress_thread: also advance the all-reduces from a background thread.
        debug: check after the broadcast that every rank holds the same parameters.
        tracer: a `mpidp.trace.Tracer` that records layers and buckets.
    """

    def __init__(self, model, comm, bucket_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 overlap: bool = True, algorithm: str = "auto", progress_thread: bool = False,
                 debug: bool = False, tracer=None, progress_interval_s: float = 1e-4):
        if algorithm not in api.ALGORITHMS["allreduce"]:
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}; expected one of "
                             f"{api.ALGORITHMS['allreduce']}")
        if progress_thread and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError("progress_thread needs MPI initialized with MPI_THREAD_MULTIPLE")
        self.comm = self._own_comm(comm, algorithm)
        self.model, self.overlap, self.algorithm = model, overlap, algorithm
        self.tracer = tracer
        self.pool = ScratchPool()  # scratch of buckets in flight together
        for p in model.params.values():  # replicas start identical: rank 0's weights
            api.bcast(self.comm, p, root=0)
        if debug:
            self.check_replicas()
        self.buckets = self._make_buckets(bucket_mb * MiB, min(first_bucket_mb, bucket_mb) * MiB)
        self._bucket_of = {i: b for b in self.buckets for i in b.layers}
        self._sync = True
        self._micro = 0  # backward passes accumulated since the last all-reduce
        self._launching = False
        self._inflight: list[Bucket] = []
        self._lock = threading.Lock()
        self.t_backward = 0.0
        self.timings = {"backward": 0.0, "exposed_comm": 0.0}  # seconds, last backward
        self._thread = None
        if progress_thread:
            self._interval, self._stop, self._work = progress_interval_s, False, threading.Event()
            self._thread = threading.Thread(target=self._progress_loop, daemon=True)
            self._thread.start()
        if tracer is not None:
            for b in self.buckets:
                tracer.name_row(1 + b.index, f"bucket {b.index} (L{','.join(map(str, b.layers))})")

    # ------------------------------------------------------------ set-up

    def _own_comm(self, comm, algorithm: str):
        """A duplicate of `comm` for the buckets, so that their tags cannot meet the user's.

        The buckets use tags ``TAG_BASE + 1 + k``; an `mpidp.Comm` numbers its own
        collectives from ``TAG_BASE`` up, so on one communicator a user's collective in
        flight across `backward` could take a bucket's messages. A duplicate is a
        separate matching space. Other comm-like objects (a `CountingComm`, a proxy)
        are used as given: there, keep other mpidp collectives out of backward.
        """
        parent = comm.comm if isinstance(comm, Comm) else comm
        if not isinstance(parent, MPI.Intracomm):
            self._dup = None
            return comm
        self._dup = parent.Dup()
        if algorithm == "auto" and parent.Get_size() > 1:  # calibrate once, not per duplicate
            cost.set_model(self._dup, *cost.model(parent, api.CALIBRATION_TAG))
        return self._dup

    def _make_buckets(self, cap: float, first_cap: float) -> list[Bucket]:
        """Group layers last-to-first into buckets; make the grads views of their buffers."""
        m, xp = self.model, self.model.xp
        groups, group, size = [], [], 0
        for i in range(m.layers, 0, -1):
            group.append(i)
            size += sum(m.grads[n].nbytes for n in m.names(i))
            if size >= (first_cap if not groups else cap):
                groups.append(group)
                group, size = [], 0
        if group:
            groups.append(group)
        buckets = []
        for k, layers in enumerate(groups):
            names = [n for i in layers for n in m.names(i)]
            flat = xp.zeros(sum(m.grads[n].size for n in names), dtype=m.grads[names[0]].dtype)
            offset = 0
            for n in names:
                g = m.grads[n]
                view = flat[offset : offset + g.size].reshape(g.shape)  # no copy: a view
                view[...] = g
                m.grads[n] = view  # rebind in the same dict: the optimizer sees the view
                offset += g.size
            buckets.append(Bucket(k, layers, names, flat))
        return buckets

    def check_replicas(self) -> None:
        """Raise RuntimeError unless every rank holds bitwise-identical parameters."""
        digest = hashlib.sha256()
        for name, p in self.model.params.items():
            digest.update(name.encode())
            digest.update(as_host(p).tobytes())
        mine = np.frombuffer(digest.digest(), dtype=np.uint8).copy()  # (32,)
        n = self.comm.Get_size()
        table = np.zeros(n * mine.size, dtype=np.uint8)  # (n * 32,)
        api.allgather(self.comm, mine, table)
        rows = table.reshape(n, mine.size)
        differ = [r for r in range(n) if not np.array_equal(rows[r], rows[0])]
        if differ:
            raise RuntimeError(f"parameters on ranks {differ} differ from rank 0's")

    # ------------------------------------------------------------ training step

    def forward(self, x):
        """The model's forward; with a tracer, one span per layer."""
        if self.tracer is None:
            return self.model.forward(x)
        last = [time.perf_counter()]

        def on_layer(i: int) -> None:
            now = time.perf_counter()
            self.tracer.add(f"forward L{i}", last[0], now, "forward")
            last[0] = now

        return self.model.forward(x, on_layer=on_layer)

    def backward(self, dlogits) -> None:
        """Backward with bucketed all-reduce; on return the grads hold the rank average.

        Inside `no_sync()`, only accumulates: no communication.
        """
        sync = self._sync
        self._launching = sync and self.overlap
        t0 = self.t_backward = self._t_last = time.perf_counter()
        for b in self.buckets:
            b.pending, b.handle, b.launched, b.completed = len(b.layers), None, None, None
        self.model.backward(dlogits, on_grad=self._on_grad, accumulate=self._micro > 0)
        t1 = time.perf_counter()
        if not sync:
            self._micro += 1
            self.timings = {"backward": t1 - t0, "exposed_comm": 0.0}
            return
        for b in self.buckets:  # overlap=False: every bucket starts here, in order
            if b.handle is None:
                self._launch(b)
        self._finish()
        t2 = time.perf_counter()
        self._micro = 0
        self.timings = {"backward": t1 - t0, "exposed_comm": t2 - t1}
        if self.tracer is not None:
            self.tracer.add("wait", t1, t2, "wait")

    @contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, with no all-reduce."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _on_grad(self, i: int) -> None:
        """Layer i's gradients are written: maybe launch its bucket; progress the others."""
        if self.tracer is not None:
            self.tracer.add(f"backward L{i}", self._t_last, time.perf_counter(), "backward")
        bucket = self._bucket_of[i]
        bucket.pending -= 1
        if bucket.pending == 0 and self._launching:
            self._launch(bucket)
        self._progress()
        self._t_last = time.perf_counter()

    def _launch(self, b: Bucket) -> None:
        b.launched = time.perf_counter()
        b.handle = api.iallreduce(self.comm, api.IN_PLACE, b.flat, op=AVG,
                                  algorithm=self.algorithm, tag=b.tag, pool=self.pool)
        with self._lock:
            self._inflight.append(b)
        if self._thread is not None:
            self._work.set()

    def _progress(self) -> None:
        """Advance every all-reduce in flight as far as it goes without blocking."""
        for b in list(self._inflight):
            if b.handle.test():
                self._done(b)

    def _done(self, b: Bucket) -> None:
        with self._lock:  # the progress thread and the main thread may both see it finish
            if b.completed is not None:
                return
            b.completed = time.perf_counter()
            self._inflight.remove(b)
        if self.tracer is not None:
            self.tracer.add(f"allreduce bucket {b.index}", b.launched, b.completed, "allreduce",
                            tid=1 + b.index, bytes=int(b.flat.nbytes))

    def _finish(self) -> None:
        """Complete every bucket, noting when each ends.

        Poll them all rather than block on one: a blocked wait advances only that
        bucket's rounds, and the others would sit idle behind it.
        """
        while any(b.completed is None for b in self.buckets):
            self._progress()
            os.sched_yield()  # oversubscribed ranks: let the peer we wait for run

    def _progress_loop(self) -> None:
        while not self._stop:
            if self._inflight:
                self._progress()
                time.sleep(self._interval)  # let the compute thread have the GIL
            else:
                self._work.wait(0.1)
                self._work.clear()

    # ------------------------------------------------------------ reporting

    def bucket_times(self) -> list[dict]:
        """Each bucket's launch and completion, seconds after the last backward began."""
        return [{"bucket": b.index, "layers": b.layers, "bytes": int(b.flat.nbytes),
                 "launch": b.launched - self.t_backward, "complete": b.completed - self.t_backward}
                for b in self.buckets if b.completed is not None]

    def close(self) -> None:
        """Stop the progress thread, if any, and free the buckets' communicator (collective)."""
        if self._thread is not None:
            self._stop = True
            self._work.set()
            self._thread.join()
            self._thread = None
        if self._dup is not None:
            self._dup.Free()  # self.comm is now MPI.COMM_NULL: a later collective raises
            self._dup = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
