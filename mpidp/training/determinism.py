"""What bitwise-reproducible data parallelism needs, checked before any training.

In deterministic mode (``DataParallel(..., deterministic=True)``) every backward
pass is one micro-shard of M samples, cut from the global batch the same way
whatever the number of ranks. A micro-shard's gradient then depends only on its
samples, provided its forward and backward run the same instructions wherever
they run: the same shapes (M rows, a contiguous copy), the same NumPy and BLAS
build, one BLAS thread (a threaded GEMM may split a sum differently). Rank r runs
the r-th run of K micro-shards of the global batch, in order, so the micro-shards of
all ranks, rank by rank, are the global batch's in order; their gradients are added
in that order by the ordered sum of parts (``mpidp.iallreduce_parts(...,
ordered=True)``, collectives/ordered.py), whose result depends only on that
sequence of addends, not on how it is cut among ranks: N ranks give the bits of one
rank on the global batch.

The reducers' part of it is here too: `keep_apart` keeps each ``no_sync()``
backward's gradients as a part of its bucket, and `average_parts` starts the ordered
average of a bucket's parts, all ranks'.

One backward may also hold K micro-shards side by side (``ddp.forward(x,
micro_shards=K)``, `SideBySide`; a model that keeps micro-batches apart, `protocol.py`): the
forward of a sample does not depend on the others beside it (a GEMM per sample, rows
normalized alone), and the backward computes each shard's parameter gradients by the
same NumPy call on the same rows as K backward passes would (`layers.micro_rows`).
`part_grads` gives each bucket K - 1 more parts for them: one forward, one backward,
the same bits; the GPT's deterministic step so costs about its default step's compute.

What this module refuses, since it would break that claim silently:
more than one BLAS thread, MKL without a fixed code path (``MKL_CBWR``), GPU
arrays (cuBLAS picks kernels by heuristics), and a micro-shard size M that does
not divide the rank's batch.
"""

from __future__ import annotations

import math
import operator
import os

import numpy as np

from .. import collectives as mp
from .protocol import micro_batches_apart

MAX_RANKS = 8  # the default micro-shard size serves every rank count up to this


def default_micro_batch(global_batch: int) -> int:
    """The default micro-shard size M, from the global batch alone (never from N).

    M = B / lcm{N <= 8 : N divides B}: then M divides the per-rank batch B/N for every
    rank count N <= 8 that divides B. For example B = 64: N in {1, 2, 4, 8}, lcm 8, M = 8;
    B = 60: N in {1, 2, 3, 4, 5, 6}, lcm 60, M = 1; B = 48: lcm 24, M = 2.
    """
    lcm = math.lcm(*[n for n in range(1, MAX_RANKS + 1) if global_batch % n == 0])
    return global_batch // lcm


def micro_shards(global_batch: int, size: int, micro_batch: int) -> int:
    """K, the micro-shards per rank and step; ValueError unless M divides the rank's batch."""
    if micro_batch < 1:
        raise ValueError(f"the micro-batch must be at least 1, not {micro_batch}")
    if global_batch % size:
        raise ValueError(f"global batch {global_batch} does not split over {size} ranks")
    local = global_batch // size
    if local % micro_batch:
        raise ValueError(f"micro-batch {micro_batch} does not divide the per-rank batch "
                         f"{local} (= global batch {global_batch} / {size} ranks): "
                         f"deterministic training needs whole micro-shards on every rank")
    return local // micro_batch


def check_reproducible(xp=np) -> None:
    """RuntimeError if this process cannot compute a micro-shard's gradient reproducibly."""
    if xp is not np:
        raise RuntimeError("deterministic training runs on NumPy arrays only: GPU libraries "
                           "choose kernels (and summation orders) by heuristics")
    from threadpoolctl import threadpool_info  # a dependency of mpidp (and scikit-learn's)

    for lib in threadpool_info():
        if lib.get("user_api") != "blas":
            continue
        if lib.get("num_threads", 1) > 1:
            raise RuntimeError(
                f"deterministic training needs one BLAS thread, and {lib['internal_api']} "
                f"({lib.get('filepath')}) runs {lib['num_threads']}: run it inside threadpoolctl's "
                "threadpool_limits(1, user_api='blas') (the trainers' --blas-threads 1 does), "
                "or set OPENBLAS_NUM_THREADS=1 / MKL_NUM_THREADS=1")
        if lib.get("internal_api") == "mkl" and not os.environ.get("MKL_CBWR"):
            raise RuntimeError("deterministic training with MKL needs a fixed code path: "
                               "set MKL_CBWR (for example MKL_CBWR=COMPATIBLE)")


def keep_apart(buckets, synced: bool) -> None:
    """After a backward: inside ``no_sync()`` keep each bucket's gradients as one more part
    (added later, exactly, with the others); after the synced one, drop the parts."""
    for b in buckets:
        if synced:
            b.parts = []
        else:
            b.parts.append(b.flat.copy())


class PartGrads(list):
    """`part_grads`' K - 1 dicts, and ``stacked``: name -> one (K - 1, *shape) view whose
    [k] is the k-th dict's array (the parts are rows of one array), for a backward that
    writes them all with one batched product (`protocol.py`)."""

    def __init__(self, dicts, stacked: dict):
        super().__init__(dicts)
        self.stacked = stacked


def part_grads(buckets, grads, k: int, spare: dict) -> PartGrads:
    """K - 1 more parts for each bucket, kept after its earlier ones (``b.parts``), and the
    K - 1 dicts of views into them, each laid out as ``grads`` is in the bucket: where a
    backward of K micro-shards writes the first K - 1 shards' gradients. A bucket's K - 1
    parts are the rows of one array (``stacked``: each gradient's K - 1 views as one).

    `spare` keeps them, by (parts already kept, K), for the next step's backward: the
    buckets' buffers are fixed (stage 0, ZeRO 1), and a step's exact sums are done before
    the next step's backward writes (no_sync()'s earlier parts take other keys)."""
    key = (len(buckets[0].parts), k) if buckets else (0, k)
    if key not in spare:
        made, stacked = [], {}
        for b in buckets:
            rows = np.zeros((k - 1, b.flat.size), b.flat.dtype)  # gaps: 0
            made.append(list(rows))  # the parts
            for name in b.names:
                g = grads[name]
                at = (g.ctypes.data - b.flat.ctypes.data) // g.itemsize  # where in the bucket
                if not 0 <= at <= b.flat.size - g.size:  # a gradient not in its bucket
                    raise RuntimeError(f"part_grads: {name}'s gradient is not a view of "
                                       f"bucket {b.index}'s buffer")
                stacked[name] = rows[:, at:at + g.size].reshape(k - 1, *g.shape)  # a view
                if not np.shares_memory(stacked[name], rows):  # (reshape may copy)
                    raise RuntimeError(f"part_grads: {name}'s parts are not views")
        views = [{name: s[j] for name, s in stacked.items()} for j in range(k - 1)]
        spare[key] = made, PartGrads(views, stacked)
    made, views = spare[key]
    for b, new in zip(buckets, made, strict=True):
        b.parts.extend(new)
        b.spares = new
    return views


class SideBySide:
    """A forward's K micro-shards side by side (``ddp.forward(x, micro_shards=K)``): K,
    checked, and the parts' buffers of `part_grads`, kept for the next steps."""

    def __init__(self, ddp):
        self.ddp, self.k, self.kept = ddp, 1, {}

    def forward_args(self, x, k) -> dict:
        """The model's forward's keywords for K micro-shards of x; ValueError or TypeError
        where they cannot be kept apart (then: one forward and backward per micro-shard)."""
        if isinstance(k, bool) or not hasattr(k, "__index__") or operator.index(k) < 1:
            raise ValueError(f"micro_shards must be an int >= 1, not {k!r}")
        k, self.k = operator.index(k), 1  # 1 until K is checked
        if k == 1:
            return {}
        ddp, run = self.ddp, "run one forward and backward per micro-shard, inside no_sync()"
        if not ddp.deterministic:
            raise ValueError("micro_shards is deterministic mode's (deterministic=True): "
                             "without it a batch of K micro-shards is one batch")
        if not micro_batches_apart(ddp.model):
            raise TypeError(f"micro_shards: {type(ddp.model).__name__}'s backward does not "
                            f"keep micro-batches apart (protocol.py: part_grads); {run}")
        if not ddp.reducer.splits_shards:
            raise ValueError(f"micro_shards: ZeRO stage {ddp.zero} makes each bucket during "
                             f"backward; {run}")
        if getattr(x, "shape", (k,))[0] % k:
            raise ValueError(f"micro_shards={k}: {x.shape[0]} samples do not split into "
                             f"{k} equal micro-shards")
        self.k = k
        return {"micro_batches": k}

    def backward_args(self) -> dict:
        """The model's backward's keywords: K - 1 more parts of each bucket for the first
        K - 1 micro-shards' gradients (`part_grads`), none for one."""
        if self.k == 1:
            return {}
        return {"part_grads": part_grads(self.ddp.buckets, self.ddp.model.grads, self.k,
                                         self.kept)}

    @property
    def nbytes(self) -> int:
        """Bytes of the parts kept for the next steps (0 but with K > 1)."""
        return sum(a.nbytes for made, _ in self.kept.values() for new in made for a in new)


def average_parts(comm, b, out, algorithm: str, counts=None, uneven=None,
                  fixed: bool = False):
    """Start the ordered average of bucket b's parts and its gradients, all ranks', into
    `out`: rank 0's micro-shards in order, then rank 1's, ... (one rank: all of them).

    ``counts``: reduce-scatter it instead (ZeRO), rank r's block into its `out`.
    ``uneven``: under `DataParallel.join()` with ranks joined, (the addends of the ranks
    that trained, whether I did): a joined rank brings no addends (`join.py`).
    ``fixed``: b.flat is the same array at every step (stage 0, ZeRO 1).

    Where the parts are then the same arrays at every step (b.flat, after the side-by-side
    buffers of `part_grads` if any), the sum is planned once (`persistent`); other parts
    are new arrays at each step (`keep_apart`'s copies), planned at each launch.
    """
    parts = [*b.parts, b.flat]
    # every rank runs as many micro-shards (one that ran another number passes other
    # addends: another signature, as any argument the ranks disagree on; MPIDP_DEBUG=1
    # makes them all raise)
    held = [len(parts)] * comm.Get_size()
    addends = sum(held)
    if uneven is not None:  # how many the training ranks hold is theirs to swap
        (addends, trained), held = uneven, None
        parts = parts if trained else []
    kw = {"addends": addends, "algorithm": algorithm, "average": True, "ordered": True,
          "held": held}
    if fixed and uneven is None and (not b.parts or _same(b.parts, b.spares)):
        return persistent(comm, b, parts, out, counts, kw)
    if counts is None:
        return mp.iallreduce_parts(comm, parts, out, **kw)
    return mp.ireduce_scatter_parts(comm, parts, out, counts, **kw)


def persistent(comm, b, parts, out, counts, kw):
    """Start bucket b's ordered sum planned once (``b.plan``, `mp.allreduce_parts_init`),
    planned anew (the old one freed) where its parts or `out` are not the arrays it sums.

    Every rank makes and frees its plans at the same steps (a plan made takes a number
    of the comm's sequence): the parts are b.flat, fixed, after `part_grads`' buffers,
    kept by (parts before, K) alike on every rank, and compared by identity with the
    arrays the plan holds (alive, so no new array takes their place)."""
    at = (out.ctypes.data, out.size, out.dtype)  # ZeRO's out: a new view of the same block
    made = b.planned_for  # (the parts, out's place) of b.plan; None: no plan yet
    if made is None or made[1] != at or not _same(made[0], parts):
        if b.plan is not None:
            b.plan.Free()
            b.plan = b.planned_for = None  # (if planning raises: nothing left to free)
        if counts is None:
            b.plan = mp.allreduce_parts_init(comm, parts, out, **kw)
        else:
            b.plan = mp.reduce_scatter_parts_init(comm, parts, out, counts, **kw)
        b.planned_for = (parts, at)
    b.plan.Start()
    return b.plan.request


def _same(arrays, others) -> bool:
    """The same arrays (not equal ones) in the same order."""
    return len(arrays) == len(others) and all(x is y for x, y in zip(arrays, others,
                                                                        strict=True))
