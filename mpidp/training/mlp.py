"""A multilayer perceptron with a hand-written backward pass (no autograd).

Layer i (1-based) is ``h_i = act(h_{i-1} @ W_i + b_i)``; the last layer has no
activation and gives the logits. Each op is a pair of functions in the style
of Karpathy's micrograd / llm.c: ``forward`` returns ``out, cache``;
``backward(dout, cache)`` returns the input gradient.

    x (B, D0) -> [W1 b1] -> relu -> [W2 b2] -> relu -> ... -> [WL bL] -> logits (B, C)

``MLP.backward`` runs the layers from last to first and calls ``on_grad(i)`` the
moment dW_i and db_i are written: this is where data parallelism starts layer
i's gradient all-reduce while layers i-1 .. 1 are still being differentiated.
The model meets `protocol.py`, its optional parts too: with ``row_stops`` a
layer's dW is computed in slices of rows (`linear_backward_by_rows`); with
``micro_batches=K`` (forward) and ``part_grads`` (backward) the batch is K
micro-batches side by side, each layer's products stacked by micro-batch, (K, B/K, ·),
so each micro-batch's rows meet the GEMMs a batch of its own would (a 2-D product
over all B rows may round a row otherwise), and each one's dW, db written apart.

Gradients are written *into* ``model.grads[name]`` (``out=``), never by
rebinding the dict entry, so `DataParallel` can make those arrays views of its
flat bucket buffers. ``accumulate=True`` adds instead (gradient accumulation).

Arrays live on an array module ``xp`` (NumPy, or CuPy for ``device="gpu"``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from ..arrays import array_module as xp_of


def device_module(device: str = "cpu"):
    """NumPy for ``"cpu"``, CuPy for ``"gpu"`` (imported only when asked for)."""
    if device == "cpu":
        return np
    if device == "gpu":
        import cupy

        return cupy
    raise ValueError(f"device must be 'cpu' or 'gpu', not {device!r}")


# ---------------------------------------------------------------- layers

def linear_forward(x, W, b):
    """out = x @ W + b."""
    out = x @ W + b  # (B, out) = (B, in) @ (in, out) + (out,)
    cache = (x, W)
    return out, cache


def linear_backward(dout, cache, dW, db, accumulate: bool = False, need_dx: bool = True):
    """Write (or add) dW, db in place; return dx (None if not needed: the first layer).

    Args:
        dout: (B, out) gradient of the loss with respect to the layer's output.
        dW, db: (in, out), (out,) arrays written into; side by side (K, B/K, ·) tuples, in
            order, of one micro-batch's or a run of n's: (n, in, out), (n, out) (`_apart`).
    """
    x, W = cache  # (B, in), (in, out)
    runs, lo = [], 0  # side by side: (x, dout, dW, db) of micro-batch lo, or a run from lo
    for w, b in zip(dW, db, strict=True) if isinstance(dW, tuple) else ():
        at = lo if w.ndim == 2 else slice(lo, lo + len(w))  # a run: (n, in), (n, out)
        runs.append((x[at], dout[at], w, b))
        lo += 1 if w.ndim == 2 else len(w)
    if not runs:
        runs = [(x, dout, dW, db)]
    elif lo != len(x):
        raise ValueError(f"side by side: gradients for {lo} micro-batches, {len(x)} ran")
    for x, d, dW, db in runs:  # a run is one batched product: the GEMM of each alone
        if accumulate:
            dW += x.swapaxes(-1, -2) @ d  # (in, out)
            db += d.sum(axis=-2)  # (out,)
        else:
            # matmul, not x.T.dot(dout, out=dW): with OpenBLAS, dot() into an out= is slower
            # (docs/overlap.md)
            xp_of(d).matmul(x.swapaxes(-1, -2), d, out=dW)  # (in, out), into the bucket view
            d.sum(axis=-2, out=db)  # (out,)
    return dout @ W.T if need_dx else None  # (B, in); side by side (K, B/K, in)


def linear_backward_by_rows(dout, cache, dW, db, stops, accumulate: bool = False,
                            need_dx: bool = True, on_rows=None):
    """`linear_backward` in slices of rows: db, then dW's rows [0, stops[0]), [stops[0],
    stops[1]) ..., then dx in as many slices of the batch's rows; ``on_rows(stop)``
    after each dW slice (rows [0, stop) and db are written) and ``on_rows(None)``
    after each dx slice but the last.

    Every element is computed from the same operands as in `linear_backward`; only
    the matrix products are cut (BLAS may round a cut product differently).
    """
    x, W = cache  # (B, in), (in, out)
    if accumulate:
        db += dout.sum(axis=0)  # (out,)
    else:
        dout.sum(axis=0, out=db)  # (out,)
    start = 0
    for stop in stops:
        xs = x[:, start:stop].T  # (rows, B)
        if accumulate:
            dW[start:stop] += xs @ dout  # (rows, out)
        else:
            xp_of(dout).matmul(xs, dout, out=dW[start:stop])  # (rows, out), in place
        if on_rows is not None:
            on_rows(stop)
        start = stop
    if not need_dx:
        return None
    B = dout.shape[0]
    cuts = sorted({B * k // len(stops) for k in range(len(stops) + 1)})
    dx = xp_of(dout).empty((B, W.shape[0]), dtype=dout.dtype)  # (B, in)
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        xp_of(dout).matmul(dout[lo:hi], W.T, out=dx[lo:hi])  # (rows of the batch, in)
        if on_rows is not None and hi < B:
            on_rows(None)
    return dx


def relu_forward(x):
    out = x * (x > 0)  # (B, H); x * mask keeps -0.0 out and is cheap
    return out, out


def relu_backward(dout, cache):
    out = cache  # (B, H)
    return dout * (out > 0)  # (B, H)


def tanh_forward(x):
    out = xp_of(x).tanh(x)  # (B, H)
    return out, out


def tanh_backward(dout, cache):
    out = cache  # (B, H)
    return dout * (1 - out * out)  # (B, H)


ACTIVATIONS = {
    "relu": (relu_forward, relu_backward),
    "tanh": (tanh_forward, tanh_backward),
}


def softmax_cross_entropy(logits, labels, micro_batches: int = 1) -> tuple[float, object]:
    """Mean cross-entropy over the batch and its gradient; stable for large logits.

    Returns:
        loss: a Python float, ``-mean(log softmax(logits)[b, labels[b]])``.
        dlogits: (B, C), ``(softmax(logits) - onehot(labels)) / B``; with
            ``micro_batches=K`` (K of B/K rows side by side) ``/ (B/K)``: each one's mean's.
    """
    xp = xp_of(logits)
    B = logits.shape[0]
    k = micro_batches
    if isinstance(k, bool) or operator.index(k) < 1 or B % k:
        raise ValueError(f"{B} rows do not split into micro_batches={k!r} equal micro-batches")
    shifted = logits - logits.max(axis=1, keepdims=True)  # (B, C); max 0: exp cannot overflow
    logz = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))  # (B, 1)
    logp = shifted - logz  # (B, C) log-probabilities
    rows = xp.arange(B)  # (B,)
    loss = -float(logp[rows, labels].mean())
    dlogits = xp.exp(logp)  # (B, C) softmax
    dlogits[rows, labels] -= 1  # (B, C) softmax - onehot
    dlogits /= B // k  # the loss is a mean over the batch (over each micro-batch)
    return loss, dlogits


# ---------------------------------------------------------------- model

class MLP:
    """Fully connected network; ``params`` and ``grads`` are dicts W1, b1, W2, b2, ...

    Args:
        sizes: layer widths, input first, classes last, e.g. ``[64, 128, 64, 10]``.
        activation: ``"relu"`` or ``"tanh"``, between layers (not after the last).
        dtype: ``"float32"`` or ``"float64"``.
        seed: the initial weights depend on it alone (He/Xavier normal, zero biases),
            drawn on the host in float64 so every device and rank gets the same values.
        device: ``"cpu"`` (NumPy) or ``"gpu"`` (CuPy).
    """

    cuts_rows = True  # backward takes row_stops and on_rows (protocol.py)
    micro_batches_apart = True  # forward takes micro_batches, backward part_grads (protocol.py)

    def __init__(self, sizes, activation: str = "relu", dtype="float32", seed: int = 0,
                 device: str = "cpu"):
        if len(sizes) < 2 or any(int(s) < 1 for s in sizes):
            raise ValueError(f"sizes must be >= 2 positive widths, got {sizes}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}")
        self.sizes, self.activation = [int(s) for s in sizes], activation
        self.dtype = np.dtype(dtype)
        self.xp = device_module(device)
        self.layers = len(sizes) - 1
        rng = np.random.default_rng(seed)
        gain = 2.0 if activation == "relu" else 1.0
        self.params, self.grads = {}, {}
        for i in range(1, self.layers + 1):
            fan_in, fan_out = self.sizes[i - 1], self.sizes[i]
            W = rng.standard_normal((fan_in, fan_out)) * np.sqrt(gain / fan_in)  # (in, out)
            self.params[f"W{i}"] = self.xp.asarray(W.astype(self.dtype))
            self.params[f"b{i}"] = self.xp.zeros(fan_out, dtype=self.dtype)  # (out,)
        for name, p in self.params.items():
            self.grads[name] = self.xp.zeros_like(p)
        self.cache = None

    def names(self, i: int) -> tuple[str, str]:
        """The parameter names of layer i."""
        return f"W{i}", f"b{i}"

    def forward(self, x, on_layer: Callable[[int], None] | None = None,
                micro_batches: int = 1):
        """logits (B, C) for x (B, D0); keeps what backward needs in ``self.cache``.

        ``micro_batches``: K micro-batches of B/K rows side by side, every layer's product
        stacked by micro-batch (module doc); the backward then takes ``part_grads``."""
        act_forward, _ = ACTIVATIONS[self.activation]
        caches = []
        if x.shape[0] % micro_batches:
            raise ValueError(f"{x.shape[0]} samples do not split into {micro_batches} "
                             "micro-batches")
        h = x if micro_batches == 1 else x.reshape(micro_batches, -1, x.shape[-1])  # (B, D0)
        for i in range(1, self.layers + 1):
            x_in = h  # (B, D_{i-1})
            h = linear_forward(x_in, self.params[f"W{i}"], self.params[f"b{i}"])[0]  # (B, D_i)
            act_cache = None
            if i < self.layers:
                h, act_cache = act_forward(h)  # (B, D_i)
            caches.append((x_in, act_cache))  # activations only: backward reads W anew
            if on_layer is not None:
                on_layer(i)
        self.cache = caches
        return h.reshape(-1, h.shape[-1])  # (B, C)

    def backward(self, dlogits, on_grad: Callable[[int], None] | None = None,
                 accumulate: bool = False, row_stops: dict | None = None,
                 on_rows: Callable[[int, int | None], None] | None = None,
                 part_grads=()) -> None:
        """Fill ``grads`` from the last layer to the first; ``on_grad(i)`` after layer i.

        Args:
            dlogits: (B, C) gradient of the loss with respect to the logits.
            accumulate: add to ``grads`` (micro-batches) instead of overwriting them.
            row_stops: layer i -> the row stops of W_i at which its backward is cut
                (`linear_backward_by_rows`); a layer not in it runs whole.
            on_rows: ``on_rows(i, stop)`` after each slice of layer i (stop: rows of
                dW_i written so far, db_i too; None: a slice of dx).
            part_grads: K - 1 dicts like ``grads``, after a forward of K micro-batches:
                the first K - 1 micro-batches' gradients (``grads`` the last one's), each
                bitwise what a backward of that micro-batch alone writes.
        """
        if self.cache is None:
            raise RuntimeError("backward() needs a forward() first")
        _, act_backward = ACTIVATIONS[self.activation]
        K = len(part_grads) + 1
        if K != (1 if self.cache[0][0].ndim == 2 else len(self.cache[0][0])):
            raise ValueError(f"part_grads: {K - 1} dicts, for a forward of "
                             f"{self.cache[0][0].shape[:-1]} rows")
        if row_stops and K > 1:
            raise ValueError("row_stops cut a product, part_grads keep micro-batches apart: "
                             "not both")
        dout = dlogits if K == 1 else dlogits.reshape(K, -1, dlogits.shape[-1])  # (B, C)
        for i in range(self.layers, 0, -1):
            x_in, act_cache = self.cache[i - 1]
            if act_cache is not None:
                dout = act_backward(dout, act_cache)  # (B, D_i)
            dW, db = (self.grads[f"W{i}"], self.grads[f"b{i}"]) if K == 1 else (
                self._apart(f"W{i}", part_grads), self._apart(f"b{i}", part_grads))
            lin_cache = (x_in, self.params[f"W{i}"])  # (B, in), (in, out)
            if row_stops and i in row_stops:
                rows = None if on_rows is None else (lambda stop, i=i: on_rows(i, stop))
                dout = linear_backward_by_rows(dout, lin_cache, dW, db, row_stops[i],
                                               accumulate, need_dx=i > 1, on_rows=rows)
            else:
                dout = linear_backward(dout, lin_cache, dW, db, accumulate, need_dx=i > 1)
            del lin_cache  # W is the caller's again once its layer is done
            if on_grad is not None:
                on_grad(i)
        self.cache = None  # free the activations, as autograd does

    def _apart(self, name: str, part_grads) -> tuple:
        """Where K micro-batches' gradients of `name` go: the K - 1 of `part_grads` (one run
        where they are rows of one array: ``stacked``, `protocol.py`), then ``grads``."""
        stacked = getattr(part_grads, "stacked", None)
        first = (stacked[name],) if stacked else tuple(g[name] for g in part_grads)
        return (*first, self.grads[name])

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0

    def num_params(self) -> int:
        return sum(int(p.size) for p in self.params.values())
