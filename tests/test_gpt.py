"""The GPT's hand-written backward, op by op and whole, against central finite differences."""

import numpy as np
import pytest

from mpidp.training import GPT
from mpidp.training import layers as ops
from mpidp.training.gpt import gpt_param_count

EPS = 1e-6
TOL = {"rtol": 1e-6, "atol": 1e-9}


def numeric_grad(f, x) -> np.ndarray:
    """d f / d x by central differences, f a scalar function of the array x (changed in place)."""
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + EPS
        plus = f()
        x[i] = old - EPS
        minus = f()
        x[i] = old
        out[i] = (plus - minus) / (2 * EPS)
    return out


def probe(shape, seed=1):
    """A fixed random weighting of an op's output: the scalar whose gradient is checked."""
    return np.random.default_rng(seed).standard_normal(shape)


def check(forward, backward, inputs: dict, grads_of_params: dict | None = None):
    """An op's backward against finite differences of sum(probe * forward(...)).

    forward(**inputs) -> out, cache; backward(dout, cache, **grad arrays) -> dx (of inputs['x']).
    """
    out, cache = forward(**inputs)
    w = probe(out.shape)
    grads = {k: np.zeros_like(inputs[v]) for k, v in (grads_of_params or {}).items()}
    dx = backward(w, cache, **grads)

    def f():
        return float((forward(**inputs)[0] * w).sum())
    if dx is not None:
        np.testing.assert_allclose(dx, numeric_grad(f, inputs["x"]), **TOL, err_msg="dx")
    for name, param in (grads_of_params or {}).items():
        np.testing.assert_allclose(grads[name], numeric_grad(f, inputs[param]), **TOL,
                                   err_msg=name)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


def test_layernorm_backward():
    x, w, b = rnd(2, 3, 5), 1 + 0.1 * rnd(5, seed=1), 0.1 * rnd(5, seed=2)
    check(lambda x, w, b: ops.layernorm_forward(x, w, b),
          lambda d, c, dw, db: ops.layernorm_backward(d, c, w, dw, db),
          {"x": x, "w": w, "b": b}, {"dw": "w", "db": "b"})


def test_linear_backward():
    x, W, b = rnd(2, 3, 4), rnd(4, 6, seed=1), rnd(6, seed=2)
    check(lambda x, W, b: ops.linear_forward(x, W, b),
          lambda d, c, dW, db: ops.linear_backward(d, c, W, dW, db),
          {"x": x, "W": W, "b": b}, {"dW": "W", "db": "b"})


def test_gelu_backward_and_values():
    x = rnd(2, 3, 7) * 2
    check(lambda x: ops.gelu_forward(x), lambda d, c: ops.gelu_backward(d, c), {"x": x})
    out, _ = ops.gelu_forward(np.array([0.0, 1.0, -1.0, 10.0]))
    np.testing.assert_allclose(out, [0.0, 0.841192, -0.158808, 10.0], atol=1e-6)  # GPT-2's


@pytest.mark.parametrize("n_head", [1, 2])
def test_attention_backward(n_head):
    qkv = rnd(2, 5, 3 * 4)  # (B, T, 3C), C = 4
    check(lambda x: ops.attention_forward(x, n_head), ops.attention_backward, {"x": qkv})


def test_attention_is_causal():
    qkv = rnd(1, 6, 3 * 4)
    y, _ = ops.attention_forward(qkv, 2)
    changed = qkv.copy()
    changed[:, 4:] += 1.0  # the future of tokens 0..3
    y2, _ = ops.attention_forward(changed, 2)
    np.testing.assert_array_equal(y[:, :4], y2[:, :4])
    assert not np.allclose(y[:, 4:], y2[:, 4:])


def test_embedding_and_head_backward():
    idx = np.array([[0, 2, 2], [1, 0, 2]])  # repeated tokens: their rows must add up
    wte, wpe = rnd(3, 4), rnd(5, 4, seed=1)
    check(lambda wte, wpe: ops.embedding_forward(idx, wte, wpe),
          lambda d, c, dwte, dwpe: ops.embedding_backward(d, c, dwte, dwpe),
          {"wte": wte, "wpe": wpe}, {"dwte": "wte", "dwpe": "wpe"})
    x = rnd(2, 3, 4, seed=2)
    check(lambda x, wte: ops.head_forward(x, wte),
          lambda d, c, dwte: ops.head_backward(d, c, wte, dwte),
          {"x": x, "wte": wte}, {"dwte": "wte"})


def tiny(seed=3, **kw) -> GPT:
    config = {"vocab": 7, "context": 5, "n_layer": 2, "n_head": 2, "width": 4}
    model = GPT(**{**config, **kw}, dtype="float64", seed=seed)
    rng = np.random.default_rng(seed)
    for p in model.params.values():  # off GPT-2's init (zero biases, unit gains)
        p += 0.1 * rng.standard_normal(p.shape)
    return model


def test_whole_model_backward_matches_central_differences():
    model = tiny()
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 7, (2, 4)), rng.integers(0, 7, (2, 4))  # T = 4 < context
    _, dlogits = model.loss(idx, targets)
    model.backward(dlogits)
    for name, p in model.params.items():
        numeric = numeric_grad(lambda: model.loss(idx, targets)[0], p)
        np.testing.assert_allclose(model.grads[name], numeric, **TOL, err_msg=name)
    assert np.all(model.grads["wpe"][4] == 0)  # position 4 unused at T = 4


def test_parameter_count_is_the_docstring_formula():
    for V, T, L, nh, C in [(7, 5, 2, 2, 4), (65, 32, 3, 4, 16), (100, 64, 1, 1, 8)]:
        model = GPT(V, T, L, nh, C, dtype="float64")
        assert model.num_params() == gpt_param_count(V, T, C, L)
        assert model.num_params() == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def test_units_call_back_in_order_after_their_gradients_are_written():
    model = tiny()
    idx = np.zeros((1, 3), dtype=np.int64)
    seen_fwd, seen_bwd = [], []
    _, d = model.loss(idx, idx)
    model.forward(idx, on_layer=seen_fwd.append)
    written = {}

    def on_grad(i):
        seen_bwd.append(i)
        written[i] = {n: model.grads[n].copy() for n in model.names(i)}

    model.backward(d, on_grad=on_grad)
    assert seen_fwd == [1, 2, 3, 4] and seen_bwd == [4, 3, 2, 1]
    assert model.names(1) == ("wte", "wpe") and "wte" in model.names(4)
    for i in (2, 3, 4):  # a unit's own gradients are final when it calls back ...
        for n in model.names(i):
            if n != "wte":
                np.testing.assert_array_equal(written[i][n], model.grads[n])
    # ... but the tied wte gets the embedding's part after the head's
    assert not np.array_equal(written[4]["wte"], model.grads["wte"])


def test_accumulate_adds_and_backward_frees_the_cache():
    model = tiny()
    idx = np.array([[1, 2, 3]])
    _, d = model.loss(idx, idx)
    model.backward(d)
    once = {k: g.copy() for k, g in model.grads.items()}
    model.forward(idx)
    model.backward(d, accumulate=True)
    for k in once:
        np.testing.assert_allclose(model.grads[k], 2 * once[k], err_msg=k)
    with pytest.raises(RuntimeError, match="forward"):
        model.backward(d)


def test_init_bad_shapes_and_generate():
    a, b = GPT(7, 5, seed=1, width=8, n_head=2), GPT(7, 5, seed=1, width=8, n_head=2)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert a.params["wte"].dtype == np.float32
    with pytest.raises(ValueError, match="multiple"):
        GPT(7, 5, n_head=3, width=8)
    with pytest.raises(ValueError, match="T <= 5"):
        a.forward(np.zeros((1, 6), dtype=np.int64))
    out = a.generate(np.array([[1, 2]]), 6, np.random.default_rng(0))  # past the context
    assert out.shape == (1, 8) and out[0, :2].tolist() == [1, 2] and out.max() < 7


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_key_bias_gradient_is_exactly_zero(dtype):
    """The key bias adds q·b_k to every score of a row, which softmax ignores: its gradient
    is 0, and written as exactly 0 (not rounding noise), in every block; so Adam leaves
    the key bias at exactly 0 (noise would be scaled up to steps of about lr)."""
    from mpidp.training import Adam

    model = GPT(vocab=11, context=6, n_layer=2, n_head=2, width=8, dtype=dtype, seed=3)
    opt = Adam(model.params, model.grads, lr=1e-2, eps=1e-30)
    rng = np.random.default_rng(0)
    C = model.width
    for _ in range(3):
        x = rng.integers(0, 11, (4, 6))
        _, dlogits = model.loss(x, np.roll(x, -1, axis=1))
        model.backward(dlogits)
        for blk in (1, 2):
            g = model.grads[f"h{blk}.attn_b"]
            assert not g[C:2 * C].any(), (blk, g[C:2 * C])  # exactly 0.0
            assert g[:C].any() and g[2 * C:].any()  # the query and value biases do learn
        opt.step()
    for blk in (1, 2):
        assert not model.params[f"h{blk}.attn_b"][C:2 * C].any()
