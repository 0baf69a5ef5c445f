"""Optimizers against their textbook formulas, written out here once more, step by step."""

import numpy as np
import pytest

from mpidp.training import SGD, Adam, AdamW
from mpidp.training.optim import OPTIMIZERS

STEPS = 5


def problem(seed=0):
    """Two parameters and a fresh gradient for every step (float64)."""
    rng = np.random.default_rng(seed)
    params = {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(STEPS)]
    return params, grads


def run(opt_cls, params, grad_steps, **hyper):
    params = {k: v.copy() for k, v in params.items()}
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    opt = opt_cls(params, grads, **hyper)
    for g in grad_steps:
        for k in grads:
            grads[k][...] = g[k]
        opt.step()
    return params, opt


def adam_reference(params, grad_steps, lr, beta1, beta2, eps, weight_decay, decoupled):
    """Kingma and Ba's Algorithm 1, with torch's two kinds of weight decay."""
    out = {}
    for k, p in params.items():
        p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
        for t, g in enumerate(grad_steps, start=1):
            g = g[k]
            if decoupled:
                p = p - lr * weight_decay * p
            else:
                g = g + weight_decay * p
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g**2
            m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
            p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
        out[k] = p
    return out


@pytest.mark.parametrize("cls,decoupled", [(Adam, False), (AdamW, True)])
def test_adam_and_adamw_follow_the_textbook_update(cls, decoupled):
    params, grad_steps = problem()
    hyper = {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}
    got, opt = run(cls, params, grad_steps, **hyper)
    expected = adam_reference(params, grad_steps, 0.01, 0.8, 0.99, 1e-6, 0.1, decoupled)
    for k in params:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-13, atol=1e-15)
    assert opt.steps == STEPS and opt.copies() == 2
    assert opt.state_bytes() == 2 * sum(p.nbytes for p in params.values())
    # the other kind of decay gives another answer: the test can tell them apart
    other = adam_reference(params, grad_steps, 0.01, 0.8, 0.99, 1e-6, 0.1, not decoupled)
    assert not np.allclose(got["W"], other["W"], rtol=1e-6)


def test_defaults_are_pytorchs():
    p, g = {"w": np.ones(2)}, {"w": np.ones(2)}
    assert Adam(p, g).hyper == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                "weight_decay": 0.0}
    assert AdamW(p, g).hyper["weight_decay"] == 1e-2
    assert SGD(p, g).hyper == {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
    assert set(OPTIMIZERS) == {"sgd", "adam", "adamw"}


def test_sgd_momentum_follows_the_textbook_update():
    params, grad_steps = problem(1)
    got, opt = run(SGD, params, grad_steps, lr=0.1, momentum=0.9, weight_decay=0.01)
    for k, p in params.items():
        p, v = p.copy(), None
        for g in grad_steps:
            d = g[k] + 0.01 * p
            v = d if v is None else 0.9 * v + d
            p = p - 0.1 * v
        np.testing.assert_allclose(got[k], p, rtol=1e-13, atol=1e-15)
    assert opt.copies() == 1 and SGD({}, {}, momentum=0).copies() == 0


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_a_slice_of_a_flat_vector_updates_to_the_same_bits_as_the_whole(cls):
    """What sharding relies on: every update is elementwise."""
    rng = np.random.default_rng(3)
    flat, grads = rng.standard_normal(101), [rng.standard_normal(101) for _ in range(STEPS)]
    hyper = {"momentum": 0.9} if cls is SGD else {}
    whole, _ = run(cls, {"flat": flat}, [{"flat": g} for g in grads], weight_decay=0.1, **hyper)
    pieces = []
    for lo, hi in ((0, 34), (34, 68), (68, 101)):
        part, _ = run(cls, {"flat": flat[lo:hi]}, [{"flat": g[lo:hi]} for g in grads],
                      weight_decay=0.1, **hyper)
        pieces.append(part["flat"])
    assert np.array_equal(np.concatenate(pieces), whole["flat"])


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_state_dict_round_trip_resumes_bitwise(cls):
    params, grad_steps = problem(2)
    hyper = {"momentum": 0.9} if cls is SGD else {}
    straight, _ = run(cls, params, grad_steps, **hyper)
    half, opt = run(cls, params, grad_steps[:2], **hyper)
    state = {k: np.array(v) for k, v in opt.state_dict().items()}
    assert opt.state_spec(opt.steps).keys() == state.keys()
    grads = {k: np.zeros_like(v) for k, v in half.items()}
    resumed = cls(half, grads, **hyper)
    resumed.load_state_dict(state)
    for g in grad_steps[2:]:
        for k in grads:
            grads[k][...] = g[k]
        resumed.step()
    for k in params:
        assert np.array_equal(half[k], straight[k])
    with pytest.raises(ValueError, match="holds"):  # another optimizer's state
        (SGD if cls is not SGD else Adam)(half, grads).load_state_dict(state)


def test_bad_hyper_parameters_are_refused():
    p, g = {"w": np.ones(2)}, {"w": np.ones(2)}
    for bad in ({"lr": 0}, {"betas": (1.0, 0.9)}, {"eps": -1}, {"weight_decay": -0.1}):
        with pytest.raises(ValueError):
            Adam(p, g, **bad)
    with pytest.raises(ValueError):
        SGD(p, g, momentum=-1)
