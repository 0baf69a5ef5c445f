"""The MLP's hand-written backward pass, checked against central finite differences."""

import numpy as np
import pytest

from mpidp.training import MLP, SGD, softmax_cross_entropy


def loss_of(model, x, y) -> float:
    loss, _ = softmax_cross_entropy(model.forward(x), y)
    return loss


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_backward_matches_central_differences_for_every_parameter(activation):
    rng = np.random.default_rng(0)
    model = MLP([7, 6, 5, 4], activation, dtype="float64", seed=3)
    for name in model.params:  # nonzero biases, so their gradients are exercised too
        model.params[name] += 0.1 * rng.standard_normal(model.params[name].shape)
    x, y = rng.standard_normal((9, 7)), rng.integers(0, 4, 9)  # (B, D), (B,)
    _, dlogits = softmax_cross_entropy(model.forward(x), y)
    model.backward(dlogits)
    eps = 1e-6
    for name, p in model.params.items():
        numeric = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            plus = loss_of(model, x, y)
            p[i] = old - eps
            minus = loss_of(model, x, y)
            p[i] = old
            numeric[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(model.grads[name], numeric, rtol=1e-6, atol=1e-9,
                                   err_msg=name)


def test_softmax_cross_entropy_is_stable_and_mean_over_batch():
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]])  # (2, 3)
    loss, dlogits = softmax_cross_entropy(logits, np.array([0, 2]))
    assert np.isfinite(loss) and np.all(np.isfinite(dlogits))
    assert loss == pytest.approx((0.0 + np.log(3)) / 2)
    np.testing.assert_allclose(dlogits.sum(axis=1), 0, atol=1e-15)  # softmax - onehot sums to 0
    np.testing.assert_allclose(dlogits[1], np.array([1, 1, -2]) / 3 / 2)


def test_on_grad_runs_last_layer_first_after_its_gradients_are_written():
    model = MLP([4, 3, 3, 2], dtype="float64", seed=0)
    x, y = np.ones((2, 4)), np.array([0, 1])
    _, dlogits = softmax_cross_entropy(model.forward(x), y)
    seen = []

    def on_grad(i):
        seen.append(i)
        assert np.any(model.grads[f"W{i}"] != 0)  # written before the callback

    model.backward(dlogits, on_grad=on_grad)
    assert seen == [3, 2, 1]


def test_accumulate_adds_and_one_forward_is_one_backward():
    model = MLP([4, 3, 2], dtype="float64", seed=0)
    x, y = np.random.default_rng(1).standard_normal((5, 4)), np.array([0, 1, 1, 0, 1])
    _, d = softmax_cross_entropy(model.forward(x), y)
    model.backward(d)
    once = {k: g.copy() for k, g in model.grads.items()}
    model.forward(x)
    model.backward(d, accumulate=True)
    for k in once:
        np.testing.assert_allclose(model.grads[k], 2 * once[k])
    with pytest.raises(RuntimeError, match="forward"):
        model.backward(d)  # the cache is freed by backward


def test_init_depends_on_seed_and_dtype_only():
    a, b = MLP([5, 4, 3], seed=7, dtype="float64"), MLP([5, 4, 3], seed=7, dtype="float64")
    c = MLP([5, 4, 3], seed=8, dtype="float64")
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["W1"], c.params["W1"])
    assert MLP([5, 4, 3], dtype="float32").params["W1"].dtype == np.float32
    assert list(a.params) == ["W1", "b1", "W2", "b2"]
    with pytest.raises(ValueError):
        MLP([5])


def test_sgd_momentum_and_weight_decay_follow_the_pytorch_rule():
    params, grads = {"w": np.array([1.0, -2.0])}, {"w": np.array([0.5, 0.5])}
    opt = SGD(params, grads, lr=0.1, momentum=0.9, weight_decay=0.01)
    p, v = np.array([1.0, -2.0]), None
    for _ in range(3):
        g = grads["w"] + 0.01 * p
        v = g if v is None else 0.9 * v + g
        p = p - 0.1 * v
        opt.step()
    np.testing.assert_allclose(params["w"], p, rtol=1e-15)


@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_by_rows_equals_the_whole_and_reports_each_slice(accumulate):
    """`row_stops` cuts each layer's products (dW by rows of W, dx by rows of the batch):
    the gradients are those of the uncut backward (the finite-difference test above),
    and on_rows says which rows are written, in order, before the layer's on_grad."""
    rng = np.random.default_rng(4)
    model = MLP([9, 7, 6, 3], dtype="float64", seed=1)
    x, y = rng.standard_normal((11, 9)), rng.integers(0, 3, 11)  # (B, D), (B,)
    start = {k: rng.standard_normal(g.shape) for k, g in model.grads.items()}
    for k, g in model.grads.items():
        g[...] = start[k]
    _, d = softmax_cross_entropy(model.forward(x), y)
    model.backward(d, accumulate=accumulate)
    whole = {k: g.copy() for k, g in model.grads.items()}
    for k, g in model.grads.items():
        g[...] = start[k]
    events = []

    def on_rows(i, stop):
        events.append((i, stop))
        if stop is not None:  # rows [0, stop) and the bias are final already
            np.testing.assert_allclose(model.grads[f"W{i}"][:stop], whole[f"W{i}"][:stop],
                                       rtol=1e-14, atol=1e-15)
            np.testing.assert_allclose(model.grads[f"b{i}"], whole[f"b{i}"], rtol=1e-14)

    model.forward(x)
    row_stops = {1: [2, 5, 9], 2: [7], 3: [1, 2, 3, 4, 5, 6]}  # uneven, whole, one row each
    model.backward(d, on_grad=lambda i: events.append(("grad", i)), accumulate=accumulate,
                   row_stops=row_stops, on_rows=on_rows)
    for k in whole:
        np.testing.assert_allclose(model.grads[k], whole[k], rtol=1e-14, atol=1e-15, err_msg=k)
    assert events == [(3, s) for s in row_stops[3]] + [(3, None)] * 5 + [("grad", 3), (2, 7),
                      ("grad", 2)] + [(1, s) for s in row_stops[1]] + [("grad", 1)]
