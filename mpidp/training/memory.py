"""Memory per rank: the model states it holds (ZeRO's accounting), and a step's peak.

Model states are the parameters, the gradients and the optimizer state that a
rank holds between steps. They are counted from the arrays themselves: each
array's owner (a view counts as the array it looks into) once. For P
parameters of the same size as the gradients, K optimizer copies per parameter
(SGD 0, SGD with momentum 1, Adam 2) and this rank's shard of S items
(``Blocks.even(P, N)``: P/N when N divides P):

    stage 0   P + G + K·P
    stage 1   P + G + K·S
    stage 2   P + S + K·S          (S for the gradients: G/N)
    stage 3   S + S + K·S          (S: the sum of my blocks of every unit, each unit
                                    cut into N: (P + G + K·P)/N when N divides each)

The peak of a step adds what the step allocates on top (activations, bucket
buffers in flight, the optimizer's temporaries), as tracemalloc sees it: NumPy
reports its buffers to tracemalloc. CuPy's device memory is not seen there.
"""

from __future__ import annotations

import tracemalloc

from ..collectives.algorithms.blocks import Blocks


def _owner(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def held_bytes(arrays) -> int:
    """Bytes of the distinct memory behind `arrays` (None entries skipped)."""
    owners = {}
    for a in arrays:
        if a is not None:
            o = _owner(a)
            owners[id(o)] = int(o.nbytes)
    return sum(owners.values())


def model_state_bytes(ddp) -> dict:
    """This rank's parameters, gradients and optimizer state, in bytes, and their total.

    `ddp` is a `DataParallel` built with ``optimizer=``. Every array kept counts: a
    gathered parameter buffer that stage 3 did not free shows in ``model.params``.
    """
    model = ddp.model
    gather = getattr(getattr(ddp, "reducer", None), "params", None)  # ZeRO's parameters' side
    params = [*model.params.values(), *(gather.held() if gather is not None else ())]
    out = {"params": held_bytes(params),
           "grads": held_bytes([*model.grads.values(), getattr(ddp, "grad_shard", None)]),
           "optimizer": held_bytes(a for arrays in ddp.optimizer.state.values()
                                   for a in arrays.values())}
    out["total"] = sum(out.values())
    return out


def formula_bytes(zero: int, params: int, itemsize: int, copies: int, n: int,
                  rank: int, units=None) -> int:
    """The table's formula for rank `rank` of `n`: `params` items, `copies` = K.

    ``units``: stage 3's unit sizes (items; default one unit of `params`), each cut in N.
    """
    if zero == 3:
        shard = sum(Blocks.even(u, n).counts[rank] for u in (units or [params]))
        return (2 + copies) * shard * itemsize
    shard = Blocks.even(params, n).counts[rank]
    grads = shard if zero == 2 else params
    state = copies * (shard if zero else params)
    return (params + grads + state) * itemsize


class StepPeak:
    """The most bytes allocated on top of what was allocated when it started (tracemalloc).

    ``with StepPeak() as peak: ...`` then ``peak.bytes``; or ``peak = StepPeak().start()``
    ... ``peak.stop()``, which returns the bytes.
    """

    bytes = 0

    def start(self) -> StepPeak:
        self._started = not tracemalloc.is_tracing()
        if self._started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self._base = tracemalloc.get_traced_memory()[0]
        return self

    def stop(self) -> int:
        self.bytes = tracemalloc.get_traced_memory()[1] - self._base
        if self._started:
            tracemalloc.stop()
        return self.bytes

    def __enter__(self) -> StepPeak:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
