"""One training step of the trainers on N ranks, predicted: compute, buckets, overlap.

The step is laid out as `DataParallel` runs it (docs/overlap.md):

    compute | fwd 1 .. U | bwd U | bwd U-1 | ... | bwd 1 |wait| update |
    bucket0 |            |      |==== all-reduce (its rounds) ====|
    bucket1 |                           |== all-reduce ==|

- compute: each unit's forward and backward time from a profile (`profile.py`), for the
  rank's batch (the profile's times scaled by samples, linearly); with A micro-batches,
  A - 1 forward and backward passes without communication come first;
- each bucket (`mpidp.training.buckets.make_buckets` on the model, the trainer's caps)
  starts its reduction when backward has completed its last unit (with overlap; else
  after backward), or, cut in pieces, each piece when backward has written it;
- a reduction's time is its real schedule's (`symmetry.schedule`: the algorithm's
  generators, run by the simulator), step by step: each step α per message (between
  hosts if a message crosses), its bytes at the link's or the host's rate (the busiest
  rank's port, the busiest host link), and the reductions after it (γ per byte);
- the link is shared by the reductions in flight: while k are in flight, each moves
  its bytes at 1/k of the rate (its α and γ parts are not slowed). A reduction's parts
  are spread evenly over its time (its steps are fine-grained: a ring's are all alike);
- ZeRO 1 and 2: reduce-scatter per bucket, the update on the rank's shard (1/N of it),
  then each bucket's parameters all-gathered, all at once, before the step ends.

What it leaves out: the kernel's TCP work on the computing core, and when a reduction
progresses (the trainer advances them at its hooks, here they run on their own).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .symmetry import ITEM, schedule

AUTO = ("ring", "rabenseifner", "recursive_doubling", "hierarchical")  # what auto picks from
HALVES = {"ring": ("ring", "ring"), "rabenseifner": ("recursive_halving", "recursive_doubling")}


class Net(NamedTuple):
    """α, β within a host; γ per reduced byte; α and β of a host's link; a fixed cost per call."""

    alpha: float = 15e-6
    beta: float = 0.5e-9
    gamma: float = 1e-9
    alpha_link: float = 20e-6
    beta_link: float = 8 / 10e9
    fixed: float = 0.0


class Cost(NamedTuple):
    """A reduction's time: `fixed` (α and γ, its own) and `wire` (bytes, shared) seconds;
    `marks`: where each of its steps ends, as fractions of the whole; `link`: bytes
    through the busiest host link; `sent`: bytes the busiest rank sends; the algorithm."""

    fixed: float
    wire: float
    marks: np.ndarray
    link: float
    sent: float
    algorithm: str


def _arrays(sched, cache: dict) -> tuple:
    key = ("arrays", id(sched))
    if key not in cache:
        s = sched.steps
        cache[key] = (sched, np.array([x.messages for x in s], float),
                      np.array([x.across for x in s], bool), np.array([x.port for x in s], float),
                      np.array([x.link for x in s], float), np.array([x.reduced for x in s], float))
    return cache[key][1:]


def cost(collective: str, algorithm: str, nbytes: float, N: int, ppn: int, net: Net,
         cache: dict) -> Cost:
    """The time of one reduction of `nbytes` on N ranks, `ppn` a host (0: one host)."""
    if N == 1 or nbytes == 0:
        return Cost(0.0, 0.0, np.zeros(0), 0.0, 0.0, algorithm)
    sched = schedule(collective, algorithm, N, ppn, cache)
    messages, across, port, link, reduced = _arrays(sched, cache)
    scale = nbytes / (sched.count * ITEM)
    lat = messages * np.where(across, net.alpha_link, net.alpha)
    wire = np.maximum(port * scale * net.beta, link * scale * net.beta_link)
    red = reduced * ITEM * scale * net.gamma
    total = lat + wire + red
    whole = float(total.sum())
    marks = np.cumsum(total) / whole if whole else np.zeros(0)
    return Cost(net.fixed + float(lat.sum() + red.sum()), float(wire.sum()), marks,
                sched.link * scale, sched.sent[1] * scale, algorithm)


def choose(collective: str, algorithm: str, nbytes: float, N: int, ppn: int, net: Net,
           cache: dict) -> Cost:
    """`cost` of `algorithm`; "auto": the least of `AUTO` that runs here."""
    if algorithm != "auto":
        return cost(collective, algorithm, nbytes, N, ppn, net, cache)
    found = []
    for name in AUTO:
        if name == "hierarchical" and not ppn:
            continue
        if name in ("rabenseifner", "recursive_doubling") and N & (N - 1) and N > 256:
            continue  # folded, not symmetric: too slow to simulate whole at this size
        c = cost(collective, name, nbytes, N, ppn, net, cache)
        found.append((c.fixed + c.wire, c))
    return min(found, key=lambda x: x[0])[1]


def share(starts: list[float], costs: list[Cost]) -> tuple[list[float], list[list]]:
    """When each reduction ends, started at `starts`, the wire shared by those in flight;
    and each one's progress, [(time, fraction done), ...] at every change of pace."""
    n = len(starts)
    ends, trails = [0.0] * n, [[(starts[j], 0.0)] for j in range(n)]
    done, active = [0.0] * n, []
    order = sorted(range(n), key=lambda j: starts[j])
    t, i = 0.0, 0
    while i < n or active:
        pace = {j: costs[j].fixed + len(active) * costs[j].wire for j in active}  # s, whole
        finish = {j: t + (1 - done[j]) * pace[j] for j in active}
        arrive = starts[order[i]] if i < n else math.inf
        t, was = min([arrive, *finish.values()]), t
        for j in active:
            done[j] = 1.0 if finish[j] <= t else done[j] + (t - was) / pace[j]
            trails[j].append((t, done[j]))
            if finish[j] <= t:
                ends[j] = t
        active = [j for j in active if finish[j] > t]
        while i < n and starts[order[i]] <= t:  # those that start now join the ones in flight
            j = order[i]
            i += 1
            if costs[j].fixed + costs[j].wire > 0:
                active.append(j)
            else:
                ends[j] = t
    return ends, trails


class Reduction(NamedTuple):
    """A bucket (or a piece of one): its name, the unit whose backward it waits for, how
    far into that unit's backward it is written (1: at its end), its bytes."""

    name: str
    unit: int
    at: float
    nbytes: int


def predict(units: list[tuple[int, float, float]], reductions: list[Reduction],
            update_s: float, N: int, ppn: int, net: Net, algorithm: str = "auto",
            overlap: bool = True, zero: int = 0, accum: int = 1, cache: dict | None = None,
            timeline: bool = False, cost_of=None) -> dict:
    """The predicted step on N ranks (`ppn` a host; 0 or N: one host).

    Args:
        units: (unit, forward s, backward s) of one micro-batch, units 1 .. U.
        reductions: the buckets (or pieces) in launch order.
        update_s: the optimizer's update of all parameters (ZeRO: 1/N of it).
        cost_of: ``cost_of(k, reduction) -> Cost`` instead of the all-reduce's (a
            communication hook's, `hookstep.py`).
    """
    cache = {} if cache is None else cache
    ppn = 0 if ppn >= N else ppn
    fwd = {i: f for i, f, _ in units}
    bwd = {i: b for i, _, b in units}
    U = max(fwd)
    spans, t = [], 0.0
    for _ in range(accum):
        for i in range(1, U + 1):
            spans.append(("compute", f"forward {i}", "forward", t, t + fwd[i]))
            t += fwd[i]
        start = {}
        for i in range(U, 0, -1):
            start[i] = t
            spans.append(("compute", f"backward {i}", "backward", t, t + bwd[i]))
            t += bwd[i]
    backward_end = t
    reduce, gather = ("allreduce", algorithm), None
    if zero:
        halves = HALVES[algorithm] if algorithm != "auto" else None
        reduce = ("reduce_scatter", halves[0] if halves else "ring")
        gather = ("allgather", halves[1] if halves else "ring")
    costs = [choose(*reduce, r.nbytes, N, ppn, net, cache) if cost_of is None else
             cost_of(k, r) for k, r in enumerate(reductions)]
    ready = [start[r.unit] + r.at * bwd[r.unit] if overlap else backward_end for r in reductions]
    ends, trails = share(ready, costs)
    t = max([backward_end, *ends])
    if t > backward_end:
        spans.append(("compute", "wait", "wait", backward_end, t))
    update = update_s / N if zero else update_s
    spans.append(("compute", "update", "optimizer", t, t + update))
    t += update
    gathers, gends, gtrails = [], [], []
    if gather:
        gathers = [choose(*gather, r.nbytes, N, ppn, net, cache) for r in reductions]
        gends, gtrails = share([t] * len(gathers), gathers)
        t = max([t, *gends])
    step = t
    compute = accum * (sum(fwd.values()) + sum(bwd.values())) + update
    alone = max([0.0, *share([0.0] * len(costs), costs)[0]])
    alone += max([0.0, *share([0.0] * len(gathers), gathers)[0]])
    exposed = max(0.0, step - compute)
    out = {"N": N, "ppn": ppn or N, "step_s": step, "compute_s": compute,
           "communication_s": alone, "exposed_s": exposed,
           "hidden": 1 - exposed / alone if alone > 0 else 1.0,
           "link_bytes": sum(c.link for c in costs + gathers),
           "rank_bytes": sum(c.sent for c in costs + gathers),
           "algorithms": sorted({c.algorithm for c in costs + gathers}),
           "reductions": len(reductions)}
    if timeline:
        out["spans"] = spans + [
            (f"bucket {k}", r.name, reduce[0], ready[k], ends[k]) for k, r in
            enumerate(reductions)] + [
            (f"bucket {k}", r.name, "allgather", trails_start(gtrails[k]), gends[k])
            for k, r in enumerate(reductions) if gather]
        out["rounds"] = [(f"bucket {k}", at) for k, c in enumerate(costs)
                         for at in marks(c, trails[k])]
    return out


def trails_start(trail) -> float:
    return trail[0][0]


def marks(c: Cost, trail: list, most: int = 200) -> list[float]:
    """When each of a reduction's steps ends, from its progress (at most `most` of them)."""
    if len(c.marks) == 0 or len(c.marks) > most:
        return []
    times, fractions = zip(*trail, strict=True)
    return [float(x) for x in np.interp(c.marks, fractions, times)]
