"""Bitwise reproducible torch training on mpidp's exact sum: a DDP comm hook and a helper.

`exact_avg_hook`: a DDP communication hook whose bucket reduction is mpidp's
``EXACT_AVG``. The exact sum's result depends only on the multiset of addends, so the
gradients are the same bits whatever the all-reduce algorithm, the bucket sizes and the
order the buckets complete in::

    ddp.register_comm_hook(group, mpidp.torch.exact_avg_hook)

It does not make N ranks equal one rank: each rank's gradient is the mean over its
own shard, computed in a shape that depends on N. `ExactGradients` does that, as
`mpidp.DataParallel(deterministic=True)` does for mpidp's own models: every backward pass
is one micro-shard of M samples, cut from the global batch the same way whatever N;
each micro-shard's gradient is kept apart, flattened into a vector of its own; and all
of them, on all ranks, are averaged by the exact sum of parts
(`mpidp.allreduce_parts(..., average=True)`, one addend per micro-shard). The
gradients, and so the training, are then the same bits on any number of ranks::

    exact = ExactGradients(model, group, micro_batch=M)
    loss = exact.backward(lambda x, y: F.cross_entropy(model(x), y), x_mine, y_mine)
    opt.step()

What it needs of the process, as determinism.py says for NumPy: the same torch build
and one compute thread (``torch.set_num_threads(1)``; a threaded kernel may split a
sum differently), CPU tensors, float32 or float64 parameters.
"""

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from .. import recorder
from ..collectives import api
from ..collectives.algorithms.ops import EXACT_AVG
from ..collectives.plans import IN_PLACE
from ..collectives.state import state as comm_state
from .group import ProcessGroup


def mpidp_group(group=None) -> ProcessGroup:
    """`group` (None: the default group) as this backend's ProcessGroup, or TypeError."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, ProcessGroup):
        raise TypeError(f"mpidp's exact sums need an mpidp process group, not "
                        f"{type(pg).__name__} (start with mpidp.torch.init_process_group(), "
                        f"or dist.new_group(..., backend='mpidp'))")
    return pg


# no `from __future__ import annotations` here: DDP reads this return annotation as a value
def exact_avg_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's gradients averaged by ``EXACT_AVG`` (state: the group,
    or None for the default one)."""
    pg = mpidp_group(state)
    buf = bucket.buffer()
    if buf.device.type != "cpu":
        raise TypeError(f"mpidp's exact_avg_hook takes CPU buckets, not {buf.device} ones")
    arr = buf.detach().numpy()  # DDP's bucket buffers are contiguous
    req = api.iallreduce(pg.comm, IN_PLACE, arr, op=EXACT_AVG, **pg._kw)
    recorder.name_call(comm_state(pg.comm).flight, req, f"DDP bucket {bucket.index()}")
    work = pg._start([req], [buf], None, "exact_avg_hook")
    return work.get_future().then(lambda fut: fut.value()[0])


class ExactGradients:
    """Gradients that are the same bits on any number of ranks (see the module).

    Args:
        model: a plain ``nn.Module`` (not wrapped in DDP), the same on every rank.
        group: an mpidp process group (None: the default group).
        micro_batch: M, the samples of one backward pass; it divides each rank's batch.
    """

    def __init__(self, model: nn.Module, group=None, micro_batch: int = 1):
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1, not {micro_batch}")
        self.model, self.pg, self.micro_batch = model, mpidp_group(group), micro_batch
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or not dtypes <= {torch.float32, torch.float64}:
            raise TypeError(f"ExactGradients takes float32 or float64 parameters of one "
                            f"dtype, not {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        self.size = sum(p.numel() for p in self.params)
        for p in model.state_dict().values():  # every rank starts from rank 0's weights
            dist.broadcast(p, group_src=0, group=self.pg)

    def backward(self, loss_fn: Callable, *inputs: torch.Tensor) -> float:
        """Set every parameter's ``.grad`` to the mean gradient over the global batch.

        Args:
            loss_fn: ``loss_fn(*micro_inputs)`` -> the mean loss of one micro-shard.
            inputs: this rank's share of the global batch (ranks in order), each with
                the samples on dim 0; K = len / M micro-shards.
        Returns: the mean loss over the global batch (the same bits on every rank).
        """
        n = len(inputs[0])
        if n % self.micro_batch:
            raise ValueError(f"micro_batch {self.micro_batch} does not divide this rank's "
                             f"batch of {n}: deterministic training needs whole micro-shards")
        k = n // self.micro_batch
        grads = torch.empty(k, self.size, dtype=self.dtype)  # one row per micro-shard
        losses = torch.empty(k, 1, dtype=torch.float64)
        for j in range(k):
            part = [x[j * self.micro_batch:(j + 1) * self.micro_batch].contiguous()
                    for x in inputs]
            for p in self.params:
                p.grad = None
            loss = loss_fn(*part)
            loss.backward()
            losses[j, 0] = loss.detach().double()
            at = 0
            for p in self.params:
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                grads[j, at:at + p.numel()] = g.reshape(-1)
                at += p.numel()
        addends = k * self.pg.size()
        mean = torch.empty(self.size, dtype=self.dtype)
        api.allreduce_parts(self.pg.comm, list(grads.numpy()), mean.numpy(), addends=addends,
                            average=True, **self.pg._kw)
        at = 0
        for p in self.params:
            p.grad = mean[at:at + p.numel()].view(p.shape).clone()
            at += p.numel()
        loss = torch.empty(1, dtype=torch.float64)
        api.allreduce_parts(self.pg.comm, list(losses.numpy()), loss.numpy(), addends=addends,
                            average=True, **self.pg._kw)
        return float(loss[0])
