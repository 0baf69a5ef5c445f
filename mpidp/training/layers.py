"""The transformer's ops, each a ``forward -> out, cache`` / ``backward(dout, cache, ...)`` pair.

In the style of llm.c's ``layernorm.py`` and `mlp.py`: ``forward`` returns its
output and the activations backward needs (no parameter: backward is given the
parameters it reads, as llm.c's C backward passes are); ``backward`` returns the
input gradient and writes (or, with ``accumulate``, adds) the parameter gradients
into the arrays it is given, so they may be views of DataParallel's buckets.
A parameter gradient may also be a tuple of K arrays, one per micro-batch: the
batch is then K micro-batches of B/K samples side by side, and micro-batch k's gradient
goes to the k-th array, computed by the same NumPy call on the same (B/K·T, ·)
rows as a backward of that micro-batch alone would make (`micro_rows`): deterministic
mode's one backward for all of a rank's micro-batches (`determinism.py`).
Shapes: B sequences of T tokens, C channels, V tokens in the vocabulary, nh
heads of hs = C / nh channels. Every op is checked against central finite
differences in tests/test_gpt.py.

Works on NumPy and CuPy arrays alike (the array module is the input's).
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays import array_module as xp_of


def _put(target, value, accumulate: bool) -> None:
    """target = value, or target += value: a parameter gradient, written in place."""
    if accumulate:
        target += value
    else:
        target[...] = value


def each(target) -> tuple:
    """A gradient's arrays, one per micro-batch: the tuple itself, or the one array alone."""
    return target if isinstance(target, tuple) else (target,)


def micro_rows(a, target, rows: int = 1):
    """a (B, T, ..., last) as one contiguous block per micro-batch of `target` (`each`):
    (K, B/K·T, last) with ``rows=1`` (every token a row), (K, B/K, T, ...) with
    ``rows=0`` (the samples kept). One micro-batch: ``a.reshape(-1, last)``'s rows."""
    K = len(each(target))
    return a.reshape(K, -1, a.shape[-1]) if rows else a.reshape(K, -1, *a.shape[1:])


# ---------------------------------------------------------------- embeddings

def embedding_forward(idx, wte, wpe):
    """out[b, t] = wte[idx[b, t]] + wpe[t]: token plus position embedding."""
    T = idx.shape[1]
    out = wte[idx] + wpe[:T]  # (B, T, C) = (B, T, C) + (T, C)
    return out, idx


def scatter_add(target, idx, values) -> None:
    """target[idx[k]] += values[k] for every k, repeated indices summed (np.add.at)."""
    xp = xp_of(target)
    if xp is np:
        np.add.at(target, idx, values)
    else:  # CuPy
        import cupyx

        cupyx.scatter_add(target, idx, values)


def embedding_backward(dout, cache, dwte, dwpe, accumulate: bool = False) -> None:
    """Add the token rows into dwte (always: the tied head wrote it first); dwpe likewise.

    Args:
        dout: (B, T, C). dwte: (V, C), already holding the head's part. dwpe: (T_max, C).
    """
    idx = cache  # (B, T)
    K, T = len(each(dwte)), dout.shape[1]
    for i, d, dwte_k, dwpe_k in zip(idx.reshape(K, -1), micro_rows(dout, dwte, rows=0),
                                    each(dwte), each(dwpe), strict=True):
        scatter_add(dwte_k, i, d.reshape(-1, d.shape[-1]))  # (V, C) += rows of (BT, C)
        dpos = d.sum(axis=0)  # (T, C)
        if accumulate:
            dwpe_k[:T] += dpos
        else:
            dwpe_k[...] = 0  # positions past T get no gradient
            dwpe_k[:T] = dpos


# ---------------------------------------------------------------- layer norm

def layernorm_forward(x, w, b, eps: float = 1e-5):
    """Normalize each row of x over its C channels, then scale by w and shift by b."""
    mean = x.mean(axis=-1, keepdims=True)  # (B, T, 1)
    xc = x - mean  # (B, T, C)
    var = (xc * xc).mean(axis=-1, keepdims=True)  # (B, T, 1), biased, as PyTorch
    rstd = (var + eps) ** -0.5  # (B, T, 1)
    norm = xc * rstd  # (B, T, C)
    out = norm * w + b  # (B, T, C)
    return out, (norm, rstd)


def layernorm_backward(dout, cache, w, dw, db, accumulate: bool = False):
    """dx of layer norm with gain w; dw, db written in place. dout, dx: (B, T, C)."""
    norm, rstd = cache
    for dn, d, dw_k, db_k in zip(micro_rows(dout * norm, dw), micro_rows(dout, dw), each(dw),
                                 each(db), strict=True):
        _put(dw_k, dn.sum(axis=0), accumulate)  # (C,)
        _put(db_k, d.sum(axis=0), accumulate)  # (C,)
    dnorm = dout * w  # (B, T, C)
    # norm's gradient, minus its mean and its projection on norm (mean and var's part)
    dx = dnorm - dnorm.mean(axis=-1, keepdims=True) \
        - norm * (dnorm * norm).mean(axis=-1, keepdims=True)  # (B, T, C)
    return dx * rstd  # (B, T, C)


# ---------------------------------------------------------------- linear, GELU

def linear_forward(x, W, b):
    """out = x @ W + b over the last axis."""
    out = x @ W + b  # (B, T, out) = (B, T, in) @ (in, out) + (out,)
    return out, x


def linear_backward(dout, cache, W, dW, db, accumulate: bool = False):
    """dx of x @ W + b; dW, db written in place. dout: (B, T, out), W: (in, out)."""
    x = cache  # (B, T, in)
    for x2, d2, dW_k, db_k in zip(micro_rows(x, dW), micro_rows(dout, dW), each(dW), each(db),
                                  strict=True):  # (BT, in), (BT, out) a micro-batch's rows
        _put(dW_k, x2.T @ d2, accumulate)  # (in, out)
        _put(db_k, d2.sum(axis=0), accumulate)  # (out,)
    return dout @ W.T  # (B, T, in)


GELU_S = math.sqrt(2 / math.pi)


def gelu_forward(x):
    """GELU, GPT-2's tanh approximation: 0.5 x (1 + tanh(s (x + 0.044715 x^3)))."""
    t = xp_of(x).tanh(GELU_S * (x + 0.044715 * (x * x * x)))  # (B, T, H); x**3 is a slow pow
    return 0.5 * x * (1 + t), (x, t)


def gelu_backward(dout, cache):
    x, t = cache  # (B, T, H)
    du = GELU_S * (1 + 3 * 0.044715 * x * x)  # d(inner)/dx
    return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)  # (B, T, H)


# ---------------------------------------------------------------- attention

def attention_forward(qkv, n_head: int):
    """Causal multi-head self-attention on the packed queries, keys and values.

    qkv (B, T, 3C) -> y (B, T, C): each head's softmax(q k^T / sqrt(hs)) v, where
    token t attends to tokens 0..t only (the mask: no look at the future).
    """
    xp = xp_of(qkv)
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // n_head
    # (B, T, 3, nh, hs) -> (3, B, nh, T, hs): one (T, hs) matrix per head
    q, k, v = qkv.reshape(B, T, 3, n_head, hs).transpose(2, 0, 3, 1, 4)
    scale = 1.0 / math.sqrt(hs)
    att = (q @ k.transpose(0, 1, 3, 2)) * scale  # (B, nh, T, T)
    future = xp.triu(xp.ones((T, T), dtype=bool), k=1)  # (T, T) True above the diagonal
    att = xp.where(future, -xp.inf, att)  # (B, nh, T, T)
    att = xp.exp(att - att.max(axis=-1, keepdims=True))  # the diagonal is finite: no NaN
    att /= att.sum(axis=-1, keepdims=True)  # (B, nh, T, T) rows sum to 1, future 0
    y = att @ v  # (B, nh, T, hs)
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C): heads side by side
    return y, (q, k, v, att, scale)


def attention_backward(dout, cache):
    """dqkv (B, T, 3C) from dy (B, T, C)."""
    q, k, v, att, scale = cache  # (B, nh, T, hs) x 3, (B, nh, T, T)
    B, nh, T, hs = q.shape
    dy = dout.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    datt = dy @ v.transpose(0, 1, 3, 2)  # (B, nh, T, T)
    dv = att.transpose(0, 1, 3, 2) @ dy  # (B, nh, T, hs)
    # softmax backward, row by row: att * (datt - <datt, att>); masked entries stay 0
    dpre = att * (datt - (datt * att).sum(axis=-1, keepdims=True))  # (B, nh, T, T)
    dq = (dpre @ k) * scale  # (B, nh, T, hs)
    dk = (dpre.transpose(0, 1, 3, 2) @ q) * scale  # (B, nh, T, hs)
    dqkv = xp_of(dout).stack([dq, dk, dv])  # (3, B, nh, T, hs)
    return dqkv.transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * nh * hs)  # (B, T, 3C)


# ---------------------------------------------------------------- tied output head

def head_forward(x, wte):
    """logits = x @ wte^T: the output head shares the token embedding's matrix."""
    return x @ wte.T, x  # (B, T, V) = (B, T, C) @ (C, V)


def head_backward(dout, cache, wte, dwte, accumulate: bool = False):
    """dx; the head's part of dwte written (or added) first, the embedding's added later."""
    x = cache  # (B, T, C); wte: (V, C)
    for d, x2, dwte_k in zip(micro_rows(dout, dwte), micro_rows(x, dwte), each(dwte),
                             strict=True):
        _put(dwte_k, d.T @ x2, accumulate)  # (V, C) = (BT, V)^T @ (BT, C)
    return dout @ wte  # (B, T, C)
