"""ZeRO stage 3's step, predicted: each unit's parameters all-gathered before it runs.

Stage 3 (`mpidp.training.zero3`) holds 1/N of every unit's parameters between steps.
Before a unit runs (forward, and again in backward) its parameters are all-gathered;
after its backward its gradient is reduce-scattered; nothing is gathered after the
update. Compute waits for each gather, so the compute is laid out here as it goes,
not first as `step.predict` lays out stages 0-2:

    forward  | AG 1 | fwd 1 | AG 2 | fwd 2 | ...              prefetch=False
    forward  | AG 1 | fwd 1 | fwd 2 | ...                     prefetch=True: AG k+1 runs
             |      | AG 2 |                                  while unit k computes
    backward | AG U | bwd U | AG U-1 | bwd U-1 | ...
             |              | RS U ...|        | RS U-1 ...|  (reduce-scatters in flight)

- each unit's gather needs the buckets it reads (the GPT's head reads the embedding's):
  `buckets.writers`, as `GatherPerUnit` does, and keeps what the next unit reads too;
- the host link carries one collective at a time, in the order they start (each
  starts once the link is free; its α and γ parts are its own): a simpler sharing
  than `step.share`'s, enough where gathers wait in line behind reduce-scatters;
- A micro-batches gather A times forward and backward; the reduce-scatters come in
  the last (synced) backward only; the update is on 1/N of the parameters.

What it leaves out, as `step.py` does: the kernel's TCP work on the computing core, and
that a prefetched gather advances only when the trainer calls into it (here it runs on
its own).
"""

from __future__ import annotations

from .step import HALVES, Net, choose


class Link:
    """The host link, one collective at a time in the order they start."""

    def __init__(self):
        self.free, self.busy, self.costs = 0.0, 0.0, []

    def send(self, t: float, c) -> float:
        """Start collective `c` (a `step.Cost`) at `t` or once the link is free; its end."""
        begin = max(t, self.free)
        self.free = begin + c.wire
        self.busy += c.fixed + c.wire
        self.costs.append(c)
        return self.free + c.fixed


def predict(units: list[tuple[int, float, float]], needs: dict[int, list[int]],
            completes: dict[int, int], nbytes: list[int], update_s: float, N: int, ppn: int,
            net: Net, algorithm: str = "auto", prefetch: bool = False, accum: int = 1,
            cache: dict | None = None, timeline: bool = False) -> dict:
    """The predicted stage-3 step on N ranks (`ppn` a host; 0 or N: one host).

    Args:
        units: (unit, forward s, backward s) of one micro-batch, units 1 .. U.
        needs: unit -> the buckets whose parameters it reads.
        completes: unit -> the bucket whose gradient its backward completes (its last unit).
        nbytes: each bucket's parameter bytes (= its gradient's).
    """
    cache = {} if cache is None else cache
    ppn = 0 if ppn >= N else ppn
    scatter, gather = HALVES.get(algorithm, HALVES["ring"])  # auto: the ring, as step.py
    fwd = {i: f for i, f, _ in units}
    bwd = {i: b for i, _, b in units}
    U = max(fwd)
    link, spans, t = Link(), [], 0.0
    gathered: dict[int, float] = {}  # bucket -> when its gather ends (held until released)
    scattered = []

    def fetch(k: int, at: float) -> None:
        if k not in gathered:
            c = choose("allgather", gather, nbytes[k], N, ppn, net, cache)
            gathered[k] = link.send(at, c)
            spans.append((f"bucket {k}", f"bucket {k}", "allgather", at, gathered[k]))

    def run(order: list[int], times: dict, kind: str, synced: bool) -> None:
        nonlocal t
        for n, i in enumerate(order):
            after = order[n + 1] if n + 1 < len(order) else None
            for k in needs[i]:
                fetch(k, t)
            ready = max([t, *(gathered[k] for k in needs[i])])
            if ready > t:
                spans.append(("compute", "wait", "wait", t, ready))
            t = ready
            if prefetch and after is not None:
                for k in needs[after]:
                    fetch(k, t)
            spans.append(("compute", f"{kind} {i}", kind, t, t + times[i]))
            t += times[i]
            if synced and kind == "backward" and i in completes:
                k = completes[i]
                c = choose("reduce_scatter", scatter, nbytes[k], N, ppn, net, cache)
                scattered.append(link.send(t, c))
                spans.append((f"bucket {k}", f"bucket {k}", "reduce_scatter", t, scattered[-1]))
            keep = needs[after] if after is not None else ()
            for k in needs[i]:
                if k not in keep:
                    gathered.pop(k, None)

    for a in range(accum):
        run(list(range(1, U + 1)), fwd, "forward", False)
        run(list(range(U, 0, -1)), bwd, "backward", a == accum - 1)
    end = max([t, *scattered])
    if end > t:
        spans.append(("compute", "wait", "wait", t, end))
    update = update_s / N
    spans.append(("compute", "update", "optimizer", end, end + update))
    step = end + update
    compute = accum * (sum(fwd.values()) + sum(bwd.values())) + update
    exposed = max(0.0, step - compute)
    out = {"N": N, "ppn": ppn or N, "step_s": step, "compute_s": compute,
           "communication_s": link.busy, "exposed_s": exposed,
           "hidden": 1 - exposed / link.busy if link.busy > 0 else 1.0,
           "link_bytes": sum(c.link for c in link.costs),
           "rank_bytes": sum(c.sent for c in link.costs),
           "algorithms": sorted({c.algorithm for c in link.costs}),
           "reductions": len(nbytes)}
    if timeline:
        out["spans"], out["rounds"] = spans, []
    return out
