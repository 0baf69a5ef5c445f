"""A decoder-only transformer (GPT-2's shape) with a hand-written backward pass.

    idx (B, T) -> wte[idx] + wpe[:T]                                   unit 1
       -> L x [ x + attn(ln1(x)),  then  x + mlp(ln2(x)) ]             units 2 .. L+1
       -> lnf -> logits = x @ wte^T (the head tied to the embedding)   unit L+2
       -> softmax cross-entropy over the V tokens

    attn(x) = proj(causal multi-head softmax(q k^T / sqrt(hs)) v),  q, k, v = split(x @ Wqkv)
    mlp(x)  = fcproj(gelu(fc(x))),  fc: C -> 4C, fcproj: 4C -> C

Each op is a pair in `layers.py`. The model meets the protocol of `protocol.py`
(the MLP's too): ``layers`` units, ``names(i)`` the parameters whose gradients
unit i writes, ``forward(idx, on_layer)`` calling ``on_layer(i)`` after unit i
(1 .. layers), and ``backward(dlogits, on_grad)`` calling ``on_grad(i)`` the
moment unit i's gradients are written, from the last unit to the first; forward
keeps activations only, backward reads the parameters from ``params``. The
token embedding ``wte`` is named by two units: the head
(unit L+2) writes its gradient first, the embedding (unit 1) adds to it, so
``wte``'s gradient is complete only when unit 1 is done (`buckets.py`).

Parameter count, V vocabulary, T context, C width, L blocks (asserted in tests/test_gpt.py):

    P = V·C + T·C + L·(12·C² + 13·C) + 2·C

    per block: ln1 2C, Wqkv 3C² + 3C, proj C² + C, ln2 2C, fc 4C² + 4C, fcproj 4C² + C;
    then the final layer norm's 2C. The tied head adds nothing.

Initialisation as GPT-2's: weights normal(0, 0.02), the two projections into
the residual stream (proj, fcproj) scaled by 1/sqrt(2L), biases 0, layer-norm
gains 1; drawn on the host in float64 from the seed alone.

Reference: Radford et al., "Language Models are Unsupervised Multitask
Learners" (GPT-2), 2019; Karpathy's nanoGPT and llm.c.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..arrays import as_host
from . import layers as ops
from .mlp import device_module, softmax_cross_entropy

BLOCK = ("ln1_g", "ln1_b", "attn_w", "attn_b", "proj_w", "proj_b",
         "ln2_g", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b")


def gpt_param_count(vocab: int, context: int, width: int, n_layer: int) -> int:
    """The docstring's formula: P = V·C + T·C + L·(12·C² + 13·C) + 2·C."""
    C = width
    return vocab * C + context * C + n_layer * (12 * C * C + 13 * C) + 2 * C


def token_cross_entropy(logits, targets, micro_batches: int = 1) -> tuple[float, object]:
    """Mean cross-entropy per token (nats) of logits (B, T, V) for targets (B, T); dlogits
    (`micro_batches`: of each of K micro-batches' B/K·T tokens, `softmax_cross_entropy`)."""
    B, T, V = logits.shape
    if B % micro_batches:
        raise ValueError(f"{B} samples do not split into {micro_batches} micro-batches")
    loss, dlogits = softmax_cross_entropy(logits.reshape(B * T, V), targets.reshape(-1),
                                          micro_batches)
    return loss, dlogits.reshape(B, T, V)  # (B, T, V), the mean over all B·T tokens


class GPT:
    """Decoder-only transformer; ``params``/``grads`` are dicts by name (wte, wpe, h1.attn_w, ...).

    Args:
        vocab: V, tokens in the vocabulary.
        context: T, the longest sequence (the position embedding's rows).
        n_layer, n_head, width: L blocks, heads per block, C channels (a multiple of n_head).
        dtype, seed, device: as `MLP`'s.

    ``sizes`` (V, T, L, nh, C) and ``activation`` ("gelu") are what a checkpoint
    records of the model's shape.
    """

    micro_batches_apart = True  # backward takes part_grads (protocol.py)

    def __init__(self, vocab: int, context: int, n_layer: int = 2, n_head: int = 4,
                 width: int = 64, dtype="float32", seed: int = 0, device: str = "cpu"):
        for what, v in (("vocab", vocab), ("context", context), ("n_layer", n_layer),
                        ("n_head", n_head), ("width", width)):
            if int(v) < 1:
                raise ValueError(f"{what} must be >= 1, got {v}")
        if width % n_head:
            raise ValueError(f"width {width} is not a multiple of n_head {n_head}")
        self.vocab, self.context, self.n_layer = int(vocab), int(context), int(n_layer)
        self.n_head, self.width = int(n_head), int(width)
        self.sizes = [self.vocab, self.context, self.n_layer, self.n_head, self.width]
        self.activation = "gelu"
        self.dtype = np.dtype(dtype)
        self.xp = device_module(device)
        self.layers = n_layer + 2  # units: embedding, the blocks, final norm + head
        rng = np.random.default_rng(seed)
        C, V, T = self.width, self.vocab, self.context

        def normal(*shape, std=0.02):
            return rng.standard_normal(shape) * std

        host = {"wte": normal(V, C), "wpe": normal(T, C)}
        proj_std = 0.02 / np.sqrt(2 * n_layer)
        for blk in range(1, n_layer + 1):
            host.update({
                f"h{blk}.ln1_g": np.ones(C), f"h{blk}.ln1_b": np.zeros(C),
                f"h{blk}.attn_w": normal(C, 3 * C), f"h{blk}.attn_b": np.zeros(3 * C),
                f"h{blk}.proj_w": normal(C, C, std=proj_std), f"h{blk}.proj_b": np.zeros(C),
                f"h{blk}.ln2_g": np.ones(C), f"h{blk}.ln2_b": np.zeros(C),
                f"h{blk}.fc_w": normal(C, 4 * C), f"h{blk}.fc_b": np.zeros(4 * C),
                f"h{blk}.fcproj_w": normal(4 * C, C, std=proj_std), f"h{blk}.fcproj_b": np.zeros(C),
            })
        host.update({"lnf_g": np.ones(C), "lnf_b": np.zeros(C)})
        self.params = {k: self.xp.asarray(v.astype(self.dtype)) for k, v in host.items()}
        self.grads = {k: self.xp.zeros_like(p) for k, p in self.params.items()}
        self.cache = None
        self._parts = []  # backward's part_grads, while it runs

    def names(self, i: int) -> tuple[str, ...]:
        """The parameters whose gradients unit i writes (``wte``: units 1 and L+2)."""
        if i == 1:
            return ("wte", "wpe")
        if i == self.layers:
            return ("lnf_g", "lnf_b", "wte")
        return tuple(f"h{i - 1}.{n}" for n in BLOCK)

    # ------------------------------------------------------------ one block

    def _block_forward(self, x, blk: int):
        p = {n: self.params[f"h{blk}.{n}"] for n in BLOCK}
        h, c_ln1 = ops.layernorm_forward(x, p["ln1_g"], p["ln1_b"])  # (B, T, C)
        qkv, c_qkv = ops.linear_forward(h, p["attn_w"], p["attn_b"])  # (B, T, 3C)
        a, c_att = ops.attention_forward(qkv, self.n_head)  # (B, T, C)
        a, c_proj = ops.linear_forward(a, p["proj_w"], p["proj_b"])  # (B, T, C)
        x = x + a  # (B, T, C) residual
        h, c_ln2 = ops.layernorm_forward(x, p["ln2_g"], p["ln2_b"])  # (B, T, C)
        h, c_fc = ops.linear_forward(h, p["fc_w"], p["fc_b"])  # (B, T, 4C)
        h, c_gelu = ops.gelu_forward(h)  # (B, T, 4C)
        h, c_fcproj = ops.linear_forward(h, p["fcproj_w"], p["fcproj_b"])  # (B, T, C)
        x = x + h  # (B, T, C) residual
        return x, (c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc, c_gelu, c_fcproj)

    def _target(self, name: str):
        """Where backward writes `name`'s gradient: ``grads[name]``, or with ``part_grads``
        the tuple of each micro-batch's array, the last one ``grads[name]`` (`layers.each`)."""
        if not self._parts:
            return self.grads[name]
        return (*[part[name] for part in self._parts], self.grads[name])

    def _block_backward(self, dx, cache, blk: int, acc: bool):
        g = {n: self._target(f"h{blk}.{n}") for n in BLOCK}
        p = {n: self.params[f"h{blk}.{n}"] for n in BLOCK}
        c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc, c_gelu, c_fcproj = cache
        dh = ops.linear_backward(dx, c_fcproj, p["fcproj_w"], g["fcproj_w"], g["fcproj_b"],
                                 acc)  # (B, T, 4C)
        dh = ops.gelu_backward(dh, c_gelu)  # (B, T, 4C)
        dh = ops.linear_backward(dh, c_fc, p["fc_w"], g["fc_w"], g["fc_b"], acc)  # (B, T, C)
        dx = dx + ops.layernorm_backward(dh, c_ln2, p["ln2_g"], g["ln2_g"], g["ln2_b"],
                                         acc)  # residual
        da = ops.linear_backward(dx, c_proj, p["proj_w"], g["proj_w"], g["proj_b"], acc)
        da = ops.attention_backward(da, c_att)  # (B, T, 3C)
        dh = ops.linear_backward(da, c_qkv, p["attn_w"], g["attn_w"], g["attn_b"], acc)
        # the key bias adds q·b_k to every score of a row, which softmax ignores: its gradient
        # is exactly 0; written so, rather than as rounding noise that Adam would scale up and
        # that would make N ranks differ from one rank by more than rounding
        for attn_b in ops.each(g["attn_b"]):
            attn_b[self.width:2 * self.width] = 0
        return dx + ops.layernorm_backward(dh, c_ln1, p["ln1_g"], g["ln1_g"], g["ln1_b"],
                                           acc)  # (B, T, C)

    # ------------------------------------------------------------ the model

    def forward(self, idx, on_layer: Callable[[int], None] | None = None,
                micro_batches: int = 1):
        """logits (B, T, V) for token ids idx (B, T), T <= context; keeps backward's cache.

        ``micro_batches``: the batch is K micro-batches side by side, for a backward with
        ``part_grads``; nothing changes here (every product is one sample's already)."""
        if idx.ndim != 2 or not 1 <= idx.shape[1] <= self.context:
            raise ValueError(f"idx must be (B, T) with 1 <= T <= {self.context}, "
                             f"got shape {idx.shape}")
        hook = on_layer or (lambda i: None)
        x, c_emb = ops.embedding_forward(idx, self.params["wte"], self.params["wpe"])
        hook(1)
        blocks = []
        for blk in range(1, self.n_layer + 1):
            x, c = self._block_forward(x, blk)  # (B, T, C)
            blocks.append(c)
            hook(blk + 1)
        x, c_lnf = ops.layernorm_forward(x, self.params["lnf_g"], self.params["lnf_b"])
        logits, c_head = ops.head_forward(x, self.params["wte"])  # (B, T, V)
        hook(self.layers)
        self.cache = (c_emb, blocks, c_lnf, c_head)
        return logits

    def backward(self, dlogits, on_grad: Callable[[int], None] | None = None,
                 accumulate: bool = False, part_grads=()) -> None:
        """Fill ``grads`` from the head to the embedding; ``on_grad(i)`` after unit i.

        Args:
            dlogits: (B, T, V) gradient of the loss with respect to the logits.
            accumulate: add to ``grads`` (micro-batches) instead of overwriting them.
            part_grads: K - 1 dicts like ``grads``: the batch is then K micro-batches of
                B/K samples, the first K - 1's gradients written into these, the last
                one's into ``grads``, each bitwise what its backward alone would write
                (`layers.micro_rows`; deterministic mode, `DataParallel.backward`).
        """
        if self.cache is None:
            raise RuntimeError("backward() needs a forward() first")
        if dlogits.shape[0] % (len(part_grads) + 1):
            raise ValueError(f"{dlogits.shape[0]} samples do not split into "
                             f"{len(part_grads) + 1} micro-batches")
        hook = on_grad or (lambda i: None)
        c_emb, blocks, c_lnf, c_head = self.cache
        self._parts, t = list(part_grads), self._target
        try:
            dx = ops.head_backward(dlogits, c_head, self.params["wte"], t("wte"),
                                   accumulate)  # (B, T, C), wte's first part
            dx = ops.layernorm_backward(dx, c_lnf, self.params["lnf_g"], t("lnf_g"),
                                        t("lnf_b"), accumulate)
            hook(self.layers)
            for blk in range(self.n_layer, 0, -1):
                dx = self._block_backward(dx, blocks[blk - 1], blk, accumulate)  # (B, T, C)
                hook(blk + 1)
            ops.embedding_backward(dx, c_emb, t("wte"), t("wpe"), accumulate)  # wte: adds
            hook(1)
        finally:
            self._parts = []
        self.cache = None

    def loss(self, idx, targets) -> tuple[float, object]:
        """Forward, then `token_cross_entropy` of the next-token targets (B, T)."""
        return token_cross_entropy(self.forward(idx), targets)

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g[...] = 0

    def num_params(self) -> int:
        return sum(int(p.size) for p in self.params.values())

    def generate(self, idx, tokens: int, rng: np.random.Generator, temperature: float = 1.0):
        """idx (B, T0) followed by `tokens` sampled tokens (B, T0 + tokens), host int64."""
        out = np.array(idx, dtype=np.int64)
        for _ in range(tokens):
            window = self.xp.asarray(out[:, -self.context:])  # (B, <= T)
            logits = self.forward(window)[:, -1, :]  # (B, V) the next token's
            self.cache = None
            z = as_host(logits).astype(np.float64) / temperature
            p = np.exp(z - z.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)  # (B, V)
            nxt = [rng.choice(p.shape[1], p=row) for row in p]
            out = np.concatenate([out, np.array(nxt, dtype=np.int64)[:, None]], axis=1)
        return out
