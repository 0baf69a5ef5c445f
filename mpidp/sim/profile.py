"""The compute side of a training step, measured once: each unit's forward and backward time.

    python -m mpidp.sim profile --model gpt --layers 4 --width 128 --batch 8 -o gpt.json

runs the trainers' own model code (`mpidp.training.MLP`, `GPT`) in this one process
and times each unit (a layer of the MLP; the GPT's embedding, blocks, head) through
the model protocol's callbacks: forward calls ``on_layer(i)`` after unit i, backward
``on_grad(i)`` once unit i's gradients are written, so the time between two calls is
one unit's. The median over ``--repeats`` runs (after one warm-up) is kept, with the
optimizer's update and the gradient bytes of each unit (which `sim step` checks
against the model its flags describe). The file is written by `mpidp.files` and read
back by `read` through `mpidp.untrusted`, schema-checked.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np

from mpidp import files, untrusted
from mpidp.training import GPT, MLP
from mpidp.training.buckets import units
from mpidp.training.optim import OPTIMIZERS, SGD
from mpidp.training.trainer import blas_threads

KIND = "mpidp.sim profile"
MAX_BYTES = 1 << 20  # a profile is a few KiB
MLP_DATA = {"digits": (64, 10), "synthetic": (256, 10)}  # features, classes (training.data)

SCHEMA = untrusted.Record({
    "kind": untrusted.Text(64),
    "model": untrusted.Text(8, ("mlp", "gpt")),
    "shape": untrusted.List(untrusted.Int(1, 1 << 24), max_len=64),
    "dtype": untrusted.Text(16, ("float32", "float64")),
    "optimizer": untrusted.Text(16, ("sgd", "adam", "adamw")),
    "batch": untrusted.Int(1, 1 << 24),
    "repeats": untrusted.Int(1, 1 << 16),
    "units": untrusted.List(untrusted.Record({
        "unit": untrusted.Int(1, 1 << 16), "forward_s": untrusted.Num(0, 1e6),
        "backward_s": untrusted.Num(0, 1e6), "grad_bytes": untrusted.Int(0, 1 << 50)}),
        max_len=1 << 12, min_len=1),
    "update_s": untrusted.Num(0, 1e6),
    "machine": untrusted.Text(256),
    "load": untrusted.Num(0, 1e6),
})


def build(model: str, shape: list[int], dtype: str, activation: str = "relu"):
    """The trainer's model: `MLP(shape)` or `GPT(vocab, context, layers, heads, width)`."""
    if model == "mlp":
        return MLP(shape, activation, dtype)
    vocab, context, layers, heads, width = shape
    return GPT(vocab, context, layers, heads, width, dtype)


def unit_bytes(m) -> dict[int, int]:
    """Unit -> the bytes of the gradients it completes (backward's order, `buckets.units`)."""
    return {i: sum(m.grads[n].nbytes for n in owned) for i, owned in units(m)}


def batch_of(model: str, m, batch: int, rng):
    """An input batch and its backward's incoming gradient (dlogits), of the model's shapes."""
    if model == "mlp":
        x = rng.standard_normal((batch, m.sizes[0])).astype(m.dtype)
        return x, (batch, m.sizes[-1])
    x = rng.integers(0, m.vocab, (batch, m.context))
    return x, (batch, m.context, m.vocab)


def optimizer(name: str, m):
    """The trainers' optimizer `name` on the model's dicts (their default hyper-parameters)."""
    if name == "sgd":
        return SGD(m.params, m.grads, 0.05, 0.9, 1e-4)
    return OPTIMIZERS[name](m.params, m.grads, 1e-3, (0.9, 0.999), 1e-8, 1e-4)


def measure(model: str, shape: list[int], batch: int, dtype: str = "float32",
            optimizer_name: str = "sgd", repeats: int = 5, activation: str = "relu") -> dict:
    """Time each unit's forward and backward on `batch` samples (median of `repeats`),
    on one BLAS thread (a rank's share of the cores, as the trainers' default)."""
    with blas_threads(1):
        return _measure(model, shape, batch, dtype, optimizer_name, repeats, activation)


def _measure(model, shape, batch, dtype, optimizer_name, repeats, activation) -> dict:
    m = build(model, shape, dtype, activation)
    rng = np.random.default_rng(0)
    x, dshape = batch_of(model, m, batch, rng)
    dlogits = (rng.standard_normal(dshape) * 1e-3).astype(m.dtype)
    opt = optimizer(optimizer_name, m)
    U = m.layers
    fwd, bwd, upd = {i: [] for i in range(1, U + 1)}, {i: [] for i in range(1, U + 1)}, []
    for run in range(repeats + 1):  # the first: a warm-up, not kept
        marks, back = [time.perf_counter()], []
        m.forward(x, lambda i, at=marks: at.append(time.perf_counter()))
        back.append(time.perf_counter())
        m.backward(dlogits, lambda i, at=back: at.append(time.perf_counter()))
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if run:
            for i in range(1, U + 1):
                fwd[i].append(marks[i] - marks[i - 1])
                bwd[i].append(back[U - i + 1] - back[U - i])  # backward runs U .. 1
            upd.append(t1 - t0)
    grad = unit_bytes(m)
    return {"kind": KIND, "model": model, "shape": list(shape), "dtype": dtype,
            "optimizer": optimizer_name, "batch": batch, "repeats": repeats,
            "units": [{"unit": i, "forward_s": statistics.median(fwd[i]),
                       "backward_s": statistics.median(bwd[i]), "grad_bytes": grad[i]}
                      for i in range(1, U + 1)],
            "update_s": statistics.median(upd), "machine": platform.node()[:256] or "?",
            "load": os.getloadavg()[0]}


def write(path: str, profile: dict) -> None:
    """`profile` as JSON at `path` (the one writer: atomic, no links followed)."""
    files.write_json(path, profile)


def read(path: str) -> dict:
    """A profile written by `write`, checked whole (`untrusted.InputError` naming the file)."""
    data = untrusted.check(untrusted.read_json(path, MAX_BYTES), SCHEMA, path)
    if data["kind"] != KIND:
        raise untrusted.InputError(f"{path}: not a profile of `python -m mpidp.sim profile` "
                                   f"(kind {data['kind']!r})")
    if [u["unit"] for u in data["units"]] != list(range(1, len(data["units"]) + 1)):
        raise untrusted.InputError(f"{path}: units: numbered 1, 2, ... in forward's order")
    return data


def matches(profile: dict, path: str, model: str, shape: list[int], dtype: str, m) -> None:
    """InputError unless the profile was measured for this model (its units' gradient bytes)."""
    got = (profile["model"], profile["shape"], profile["dtype"])
    if got != (model, list(shape), dtype):
        raise untrusted.InputError(
            f"--profile {path}: measured for {got[0]} {got[1]} {got[2]}, not the flags' "
            f"{model} {list(shape)} {dtype}")
    grad = unit_bytes(m)
    if [u["grad_bytes"] for u in profile["units"]] != [grad[i] for i in sorted(grad)]:
        raise untrusted.InputError(f"--profile {path}: its units' gradient bytes are not the "
                                   "model's")
