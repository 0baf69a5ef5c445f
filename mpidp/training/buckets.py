"""Gradient buckets: layers whose gradients share one flat buffer and one all-reduce.

The model's ``grads[name]`` become views into the buckets' buffers (PyTorch
DDP's gradient_as_bucket_view), so backward writes each gradient straight into
the buffer that is all-reduced, with no copy in or out.
"""

from __future__ import annotations


class Bucket:
    """Layers whose gradients share one flat buffer and one all-reduce."""

    __slots__ = ("index", "layers", "names", "flat", "pending", "plan", "request", "launched",
                 "parts")

    def __init__(self, index: int, layers: list[int], names: list[str], flat):
        self.index, self.layers, self.names, self.flat = index, layers, names, flat
        self.pending = len(layers)  # layers whose gradients are not written yet
        self.plan = None  # its persistent all-reduce (mpidp.allreduce_init), made once
        self.request = None  # the run in flight (mpidp.Request)
        self.launched = None  # perf_counter time of the last launch
        self.parts = []  # deterministic mode: the earlier micro-shards' gradients, kept


def make_buckets(m, cap: float, first_cap: float) -> list[Bucket]:
    """Group model `m`'s layers last-to-first into buckets; make its grads views of their buffers.

    A bucket closes once it holds `cap` bytes (the first one: `first_cap`), so
    its all-reduce can start as soon as backward has written its last layer.
    """
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
        flat = m.xp.zeros(sum(m.grads[n].size for n in names), dtype=m.grads[names[0]].dtype)
        offset = 0
        for n in names:
            g = m.grads[n]
            view = flat[offset : offset + g.size].reshape(g.shape)  # no copy: a view
            view[...] = g
            m.grads[n] = view  # rebind in the same dict: the optimizer sees the view
            offset += g.size
        buckets.append(Bucket(k, layers, names, flat))
    return buckets
