"""Where `--deterministic`'s step time goes, against the default step (issue 38, item 4).

    mpiexec -n 2 .venv/bin/python tools/determ_step.py mlp --steps 40
    mpiexec -n 2 .venv/bin/python tools/determ_step.py gpt --steps 40

Builds the trainer's model twice at its default settings (examples/train_mlp.py,
examples/train_gpt.py: their parsers' defaults), one `DataParallel` default and one
deterministic, and runs their steps in turn (default, deterministic, default, ...) on
the same batches. The deterministic step is the trainers': the K micro-shards side by
side in one forward and backward (``ddp.forward(x, micro_shards=K)``; ``--looped``:
one forward and backward each, as before). Each
deterministic step is cut into: ``compute`` (forwards, losses and backwards of the K
micro-shards, less what follows), ``keep`` (the parts' copies, `determinism.keep_apart`;
side by side, `determinism.part_grads`' buffers), ``start`` (starting the ordered sums,
`determinism.average_parts`),
``progress`` (their rounds advanced from backward's hooks, `DataParallel.on_grad`),
``wait`` (the synced backward's wait for them) and ``opt`` (the optimizer step).
Prints rank 0's medians (ms) and the ratio of the medians of the whole steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import nullcontext

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

from mpidp import collectives  # noqa: E402
from mpidp.collectives import ordered  # noqa: E402
from mpidp.collectives.ordered_chain import Route  # noqa: E402
from mpidp.training import determinism, reducers, trainer  # noqa: E402

TIMES: dict[str, float] = {}
CALLS: dict[str, int] = {}  # the timed functions' calls, by name: each must be called


def timed(key, fn):
    CALLS[fn.__name__] = 0

    def wrapper(*a, **k):
        CALLS[fn.__name__] += 1
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[key] = TIMES.get(key, 0.0) + time.perf_counter() - t0
    return wrapper


reducers.keep_apart = timed("keep", reducers.keep_apart)
determinism.part_grads = timed("keep", determinism.part_grads)
reducers.average_parts = timed("start", reducers.average_parts)
collectives.testall = timed("progress", collectives.testall)  # ddp's calls: the sums' rounds
ROUTES: set = set()  # the ordered sums' paths the model picked (ordered_chain.route), and gamma


def logged(fn):
    def wrapper(m, *a, **k):  # (m: the model, with the gamma the route reads)
        r = fn(m, *a, **k)
        ROUTES.add((f"chain S={r.segments}" if r.chain else "direct", m.gamma))
        return r
    return wrapper


ordered.route = logged(ordered.route)


def route_arg(text: str) -> Route:
    """--route: 'direct' or the chain's number of segments."""
    if text == "direct":
        return Route(False)
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected 'direct' or an int >= 1, not {text!r}")
    return Route(True, int(text))


def setup(which: str, comm, deterministic: bool):
    import train_gpt
    import train_mlp

    from mpidp.training import GPT, MLP, data
    from mpidp.training.gpt import token_cross_entropy
    from mpidp.training.mlp import softmax_cross_entropy

    mod = train_mlp if which == "mlp" else train_gpt
    args = mod.parse_args(["--deterministic"] if deterministic else [])
    trainer.blas_threads(1)
    size = comm.Get_size()
    A = trainer.micro_batches(args, size)
    b = args.global_batch // size // A
    rng = np.random.default_rng(0)
    if which == "mlp":
        ds = data.digits(seed=args.seed)
        trainer.blas_threads(1)
        model = MLP([ds.features, *args.hidden, ds.classes], args.activation, args.dtype,
                    seed=args.seed)
        x_all, y_all = ds.x_train.astype(args.dtype), ds.y_train

        def batch(step, a):
            idx = rng.integers(0, len(y_all), b)
            return x_all[idx], y_all[idx]
        loss_fn = softmax_cross_entropy
    else:
        text = data.stdlib_text(int(args.corpus_mb * (1 << 20)))
        model = GPT(len(text.vocab), args.context, args.layers, args.heads, args.width,
                    args.dtype, seed=args.seed)
        n = data.sequences(text.train, args.context)

        def batch(step, a):
            return data.batch(text.train, rng.integers(0, n, b), args.context)
        loss_fn = token_cross_entropy
    opt = trainer.make_optimizer(args, model)
    ddp = trainer.data_parallel(args, model, comm, opt, None)
    return args, ddp, A, batch, loss_fn


def step(ddp, A, batches, loss_fn, deterministic, together):
    TIMES.clear()
    t0 = time.perf_counter()
    K = A if together else 1  # the micro-shards side by side
    if together:
        batches = [tuple(np.concatenate(z) for z in zip(*batches, strict=True))]
    for a, (x, y) in enumerate(batches):
        with ddp.no_sync() if a < len(batches) - 1 else nullcontext():
            logits = ddp.forward(x, micro_shards=K)
            loss, dlogits = loss_fn(logits, y, K)
            if A > 1 and not deterministic:
                dlogits /= A
            ddp.backward(dlogits)
    wait = ddp.timings["exposed_comm"]
    t1 = time.perf_counter()
    ddp.step()
    t2 = time.perf_counter()
    out = {"step": t2 - t0, "opt": t2 - t1, "wait": wait, **TIMES}
    out["compute"] = (t1 - t0) - wait - sum(TIMES.values())
    return out


def main():
    from mpi4py import MPI
    p = argparse.ArgumentParser()
    p.add_argument("which", choices=["mlp", "gpt"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--route", default=None, type=route_arg,
                   help="force the ordered sums' path: 'direct', or the chain's segments "
                        "S (an int >= 1); default: the cost model's pick (ordered_chain.route)")
    p.add_argument("--looped", action="store_true",
                   help="the deterministic step one forward and backward per micro-shard")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    if a.route is not None:
        ordered.route = logged(lambda *args: a.route)
    runs = {False: setup(a.which, comm, False), True: setup(a.which, comm, True)}
    rows = {False: [], True: []}
    for s in range(a.warmup + a.steps):
        for det in (False, True):
            args, ddp, A, batch, loss_fn = runs[det]
            batches = [batch(s, k) for k in range(A)]
            comm.Barrier()
            together = det and not a.looped
            r = step(ddp, A, batches, loss_fn, det, together)
            if s >= a.warmup:
                rows[det].append(r)
    A = runs[True][2]
    never = [name for name, n in CALLS.items()
             if n == 0 and (name != "part_grads" or (A > 1 and not a.looped))]
    if never:  # a patched name its caller no longer reads: that part would read 0
        sys.exit(f"determ_step.py: {', '.join(never)} never called: the tool times it "
                 "by a name the training code no longer calls it by")
    if comm.Get_rank() == 0:
        load = os.getloadavg()[0]
        for det in (False, True):
            args, ddp, A, _, _ = runs[det]
            keys = ["step", "compute", "keep", "start", "progress", "wait", "opt"]
            med = {k: statistics.median(r.get(k, 0.0) for r in rows[det]) * 1e3 for k in keys}
            name = "deterministic" if det else "default"
            print(f"{a.which} {name:13s} A={A} " + " ".join(f"{k} {v:.3f}" for k, v in
                                                           med.items()))
        ratio = (statistics.median(r["step"] for r in rows[True])
                 / statistics.median(r["step"] for r in rows[False]))
        way = "looped" if a.looped else "side by side"
        paths = ", ".join(f"{r} (gamma {g * 1e9:.3f} ns/B)" for r, g in sorted(ROUTES))
        print(f"{a.which} ratio {ratio:.2f}x ({way})  load {load:.2f}  route: {paths}")
    for det in (False, True):
        runs[det][1].close()


if __name__ == "__main__":
    main()
