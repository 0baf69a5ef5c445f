"""Optimizers with state: SGD (momentum), Adam and AdamW, by PyTorch's update rules.

    SGD (dampening 0, as torch.optim.SGD):
        g = grad + weight_decay * p
        v = momentum * v + g            (v starts at g)
        p = p - lr * v

    Adam / AdamW (torch.optim.Adam / AdamW, amsgrad off), step t = 1, 2, ...:
        Adam:  g = grad + weight_decay * p          (L2 added to the gradient)
        AdamW: g = grad;  p = p * (1 - lr * weight_decay)   (decoupled decay)
        m = beta1 * m + (1 - beta1) * g             (m, v start at 0)
        v = beta2 * v + (1 - beta2) * g * g
        p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Every update is elementwise: applied to a slice of a flat parameter vector it
gives the same bits as applied to the whole. That is what lets sharded data
parallelism (`zero.py`) keep the state of only its shard and update only it.

The state is K arrays the size of the parameters (K = 0 for plain SGD, 1 with
momentum, 2 for Adam), created at the first step, as PyTorch does.
"""

from __future__ import annotations

import math

from ..arrays import array_module


class Optimizer:
    """What the optimizers share: hyper-parameters, named state arrays, checkpoints.

    Args:
        params, grads: dicts name -> array; looked up by name at every step, so
            `DataParallel` may turn the entries into views after this is built.
    """

    name = ""
    state_names: tuple[str, ...] = ()  # one array per parameter for each

    def __init__(self, params: dict, grads: dict, **hyper):
        self.params, self.grads, self.hyper = params, grads, hyper
        self.state: dict[str, dict] = {s: {} for s in self.state_names}  # s -> {name: array}
        self.steps = 0

    def like(self, params: dict, grads: dict) -> Optimizer:
        """A fresh optimizer of the same kind and hyper-parameters on other arrays."""
        return type(self)(params, grads, **self.hyper)

    def state_bytes(self) -> int:
        """Bytes of the state arrays held now."""
        return sum(int(a.nbytes) for arrays in self.state.values() for a in arrays.values())

    def copies(self) -> int:
        """K: state arrays per parameter once stepped (0, 1 or 2)."""
        return len(self._names_after(1))

    def _names_after(self, steps: int) -> tuple[str, ...]:
        return self.state_names if steps else ()

    def state_dict(self) -> dict:
        """Arrays and numbers that `load_state_dict` restores exactly."""
        return {"steps": self.steps, **{f"{s}/{k}": a for s, arrays in self.state.items()
                                        for k, a in arrays.items()}}

    def state_spec(self, steps: int) -> dict:
        """What `state_dict()` holds after `steps` steps, for checking a checkpoint:
        the numbers, and each array's stand-in (the parameter of its shape and dtype)."""
        return {"steps": steps, **{f"{s}/{k}": p for s in self._names_after(steps)
                                   for k, p in self.params.items()}}

    def load_state_dict(self, state: dict, xp=None) -> None:
        """Restore `state_dict()`'s output (arrays copied, as the parameters' dtype)."""
        steps = int(state["steps"])
        arrays = {k: v for k, v in state.items() if k != "steps"}
        foreign = [k for k in arrays if k.split("/", 1)[0] not in self.state_names]
        if foreign:
            raise ValueError(f"{type(self).__name__} holds {list(self.state_names)}, "
                             f"not {sorted(foreign)[:3]}")
        self.steps = steps
        self.state = {s: {} for s in self.state_names}
        for key, v in arrays.items():
            s, name = key.split("/", 1)
            ref = self.params[name]
            arr = v if xp is None else xp.asarray(v)
            self.state[s][name] = arr.astype(ref.dtype, copy=True).reshape(ref.shape)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and weight decay (see the module docstring)."""

    name = "sgd"
    state_names = ("velocity",)

    def __init__(self, params: dict, grads: dict, lr: float = 0.1, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0; got "
                             f"{lr}, {momentum}, {weight_decay}")
        super().__init__(params, grads, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    @property
    def velocity(self) -> dict:
        return self.state["velocity"]

    def _names_after(self, steps: int) -> tuple[str, ...]:
        return self.state_names if steps and self.momentum else ()

    def step(self) -> None:
        for name, p in self.params.items():
            g = self.grads[name]
            if self.weight_decay:
                g = g + self.weight_decay * p
            if self.momentum:
                v = self.velocity.get(name)
                if v is None:
                    v = self.velocity[name] = g.copy()
                else:
                    v *= self.momentum
                    v += g
                g = v
            p -= self.lr * g
        self.steps += 1


class Adam(Optimizer):
    """Adam (Kingma and Ba 2015) as torch.optim.Adam: weight decay is L2 added to the gradient."""

    name = "adam"
    state_names = ("exp_avg", "exp_avg_sq")
    decoupled = False  # AdamW: True

    def __init__(self, params: dict, grads: dict, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        beta1, beta2 = betas
        if lr <= 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1) or eps < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, 0 <= betas < 1, eps >= 0, weight_decay >= 0; got "
                             f"{lr}, {betas}, {eps}, {weight_decay}")
        super().__init__(params, grads, lr=lr, betas=(beta1, beta2), eps=eps,
                         weight_decay=weight_decay)
        self.lr, self.betas, self.eps, self.weight_decay = lr, (beta1, beta2), eps, weight_decay

    def step(self) -> None:
        self.steps += 1
        beta1, beta2 = self.betas
        step_size = self.lr / (1 - beta1 ** self.steps)
        bias2_sqrt = math.sqrt(1 - beta2 ** self.steps)
        exp_avg, exp_avg_sq = self.state["exp_avg"], self.state["exp_avg_sq"]
        for name, p in self.params.items():
            g = self.grads[name]
            if self.weight_decay and self.decoupled:
                p *= 1 - self.lr * self.weight_decay
            elif self.weight_decay:
                g = g + self.weight_decay * p
            xp = array_module(p)
            if name not in exp_avg:
                exp_avg[name], exp_avg_sq[name] = xp.zeros_like(p), xp.zeros_like(p)
            m, v = exp_avg[name], exp_avg_sq[name]
            # one temporary the size of p, reused: a sharded optimizer steps a whole
            # shard at once, and its temporaries count in the step's peak memory
            tmp = xp.multiply(g, 1 - beta1)
            m *= beta1
            m += tmp  # m = beta1 m + (1 - beta1) g
            xp.multiply(g, g, out=tmp)
            tmp *= 1 - beta2
            v *= beta2
            v += tmp  # v = beta2 v + (1 - beta2) g²
            denom = xp.sqrt(v, out=tmp)
            denom /= bias2_sqrt
            denom += self.eps
            xp.divide(m, denom, out=denom)
            denom *= step_size
            p -= denom  # p = p - lr/(1 - beta1^t) · m / (sqrt(v)/sqrt(1 - beta2^t) + eps)


class AdamW(Adam):
    """AdamW (Loshchilov and Hutter 2019) as torch.optim.AdamW: decoupled weight decay."""

    name = "adamw"
    decoupled = True

    def __init__(self, params: dict, grads: dict, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, grads, lr, betas, eps, weight_decay)


OPTIMIZERS = {cls.name: cls for cls in (SGD, Adam, AdamW)}
