"""SGD with momentum and weight decay (PyTorch's update rule, dampening 0).

    g = grad + weight_decay * p
    v = momentum * v + g            (v starts at g, as in PyTorch)
    p = p - lr * v

Every rank applies the same update to the same parameters with the same
averaged gradient, so replicas stay bitwise identical with no parameter traffic.
"""

from __future__ import annotations


class SGD:
    """Updates ``params[name]`` in place from ``grads[name]``.

    Args:
        params, grads: the model's dicts; looked up by name at every step, so
            `DataParallel` may turn the grads into bucket views after this is built.
    """

    def __init__(self, params: dict, grads: dict, lr: float = 0.1, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0; got "
                             f"{lr}, {momentum}, {weight_decay}")
        self.params, self.grads = params, grads
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.velocity: dict = {}  # name -> v, created at the first step
        self.steps = 0

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

    def state_dict(self) -> dict:
        """Arrays and numbers that `load_state_dict` restores exactly."""
        return {"steps": self.steps, **{f"velocity/{k}": v for k, v in self.velocity.items()}}

    def state_spec(self, steps: int) -> dict:
        """What `state_dict()` holds after `steps` steps, for checking a checkpoint:
        the numbers, and each array's stand-in (the parameter of its shape and dtype)."""
        velocity = self.momentum and steps  # created at the first step
        return {"steps": steps, **{f"velocity/{k}": p for k, p in self.params.items()
                                   if velocity}}

    def load_state_dict(self, state: dict, xp=None) -> None:
        self.steps = int(state["steps"])
        self.velocity = {}
        for key, v in state.items():
            if key.startswith("velocity/"):
                name = key.split("/", 1)[1]
                ref = self.params[name]
                arr = v if xp is None else xp.asarray(v)
                self.velocity[name] = arr.astype(ref.dtype, copy=True)
