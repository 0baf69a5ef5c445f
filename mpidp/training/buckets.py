"""Gradient buckets: units whose gradients share one flat buffer and one all-reduce.

The model protocol, the same for the MLP and the GPT (any model with these):

    params, grads    dicts name -> array
    layers           U, the number of units (an MLP layer; a GPT block, its
                     embedding, its head), numbered 1 .. U in forward's order
    names(i)         the parameters whose gradients unit i writes or adds to
    forward(x, on_layer)       calls on_layer(i) after unit i, i = 1 .. U
    backward(d, on_grad, accumulate)   calls on_grad(i) once unit i's gradients
                     are written, i = U .. 1 (backward completes them in order)

A parameter named by several units (a tied weight: the GPT's token embedding,
written by its head, unit U, then added to by its embedding, unit 1) is
complete once the last of them in backward's order is done: it belongs to that
unit's bucket (`units`). Its buffer must exist from the first unit that writes
it (`writers`: what ZeRO stage 2 allocates before each unit).

The model's ``grads[name]`` become views into the buckets' buffers (PyTorch
DDP's gradient_as_bucket_view), so backward writes each gradient straight into
the buffer that is all-reduced, with no copy in or out.
"""

from __future__ import annotations


class Bucket:
    """Units (``layers``) whose gradients share one flat buffer and one all-reduce."""

    __slots__ = ("index", "layers", "names", "flat", "pending", "plan", "request", "launched",
                 "parts")

    def __init__(self, index: int, layers: list[int], names: list[str], flat):
        self.index, self.layers, self.names, self.flat = index, layers, names, flat
        self.pending = len(layers)  # units not done yet in this backward
        self.plan = None  # its persistent all-reduce (mpidp.allreduce_init), made once
        self.request = None  # the run in flight (mpidp.Request)
        self.launched = None  # perf_counter time of the last launch
        self.parts = []  # deterministic mode: the earlier micro-shards' gradients, kept


def units(m) -> list[tuple[int, list[str]]]:
    """Model `m`'s units in backward's order (U .. 1), each with the parameters it completes.

    Every parameter appears once: with the last unit, in backward's order, that names it.
    """
    last = {}
    for i in range(m.layers, 0, -1):
        for n in m.names(i):
            last[n] = i  # overwritten by every later unit of backward: the last one stays
    return [(i, [n for n in dict.fromkeys(m.names(i)) if last[n] == i])
            for i in range(m.layers, 0, -1)]


def writers(m, buckets: list[Bucket]) -> dict[int, list[Bucket]]:
    """Unit i -> the buckets holding a parameter it writes (backward) or reads (forward)."""
    where = {n: b for b in buckets for n in b.names}
    return {i: list({id(where[n]): where[n] for n in m.names(i)}.values())
            for i in range(1, m.layers + 1)}


def make_buckets(m, cap: float, first_cap: float) -> list[Bucket]:
    """Group model `m`'s units last-to-first into buckets; make its grads views of their buffers.

    A bucket closes once it holds `cap` bytes (the first one: `first_cap`), so
    its all-reduce can start as soon as backward has completed its last unit.
    """
    groups, group, size, held = [], [], 0, 0
    owned = dict(units(m))
    for i in owned:
        group.append(i)
        size += sum(m.grads[n].nbytes for n in owned[i])
        held += len(owned[i])
        if held and size >= (first_cap if not groups else cap):  # never a bucket of nothing
            groups.append(group)
            group, size, held = [], 0, 0
    if group and (held or not groups):
        groups.append(group)
    elif group:  # units that complete no parameter: their bucket waits for them too
        groups[-1].extend(group)
    buckets = []
    for k, layers in enumerate(groups):
        names = [n for i in layers for n in owned[i]]
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
