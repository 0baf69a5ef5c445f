"""The speed targets of issue 18, evaluated on merged rows (never typed by hand).

Judged on 2 ranks (one core per rank); on other rank counts the same figures are
reported, not judged. Every figure is a ratio of medians over runs (see
runs.py), given with its run-to-run range: the same ratio within each run.

| collective | placement | sizes | figure | bound |
|---|---|---|---|---|
| all-reduce | both | ≤ 4 KiB | auto persistent time / native time | ≤ 1.5 |
| all-reduce | both | ≤ 4 KiB | auto time / native time | ≤ 2.0 |
| all-reduce, reduce-scatter | both | ≥ 1 MiB | native time / mpidp time (best, auto) | ≥ 1.0 |
| all-reduce | both | ≥ 16 MiB | native time / mpidp time (best, auto) | ≥ 1.5 |
| all-gather, broadcast | all | ≥ 1 MiB | native time / mpidp time (best, auto) | ≥ 0.95 |
| every one | all | every size | auto time / best algorithm's time | ≤ 1.1, or 1 + spread |

*best* is the fastest mpidp algorithm at that size (auto, the persistent forms
and the peers not counted); *spread* is the larger run-to-run spread, (max -
min) / median over runs, of the two rows compared at that size.
"""

from __future__ import annotations

from mpidp.bench.output import human

from .runs import ratio_range

KIB, MIB = 1 << 10, 1 << 20
JUDGED_RANKS = (2,)
PEERS = ("native", "gloo")  # rows of other implementations, never "mpidp's best"
SMALL_UP_TO = 4 * KIB
AUTO_SLACK = 0.10


def mpidp_names(by_alg: dict) -> list[str]:
    """The mpidp algorithms of one size: not a peer, not auto, not persistent."""
    return [a for a in by_alg if a not in (*PEERS, "auto") and not a.endswith(" persistent")
            and not a.startswith("native")]


def best_mpidp(by_alg: dict) -> dict | None:
    """The fastest (median) mpidp algorithm's row at one size, auto not counted."""
    names = mpidp_names(by_alg)
    return min((by_alg[a] for a in names), key=lambda r: r["time_us"]) if names else None


def span(rng: tuple[float, float] | None, fmt: str = ".2f", unit: str = "x") -> str:
    if rng is None or rng[0] == rng[1]:
        return ""
    return f" (runs {rng[0]:{fmt}}-{rng[1]:{fmt}}{unit})"


def us_range(r: dict) -> tuple[float, float] | None:
    times = [t for t in r.get("runs_us") or [] if t]
    return (min(times), max(times)) if times else None


def missed(by: float) -> str:
    """'; missed by 12%' (0.7% where under 1%: 1.49x against 1.5x is not 'by 0%')."""
    return f"; missed by {100 * by:.{0 if by >= 0.01 else 1}f}%"


def result(text: str, met, worst=None, at=None, detail: str = "") -> dict:
    return {"target": text, "met": met, "worst": worst, "at": at, "detail": detail}


def latency(sizes: dict, name: str, bound: float) -> dict:
    """Every size ≤ 4 KiB: ``name``'s time ≤ bound × native's. Worst: the largest ratio."""
    text = f"≤ {human(SMALL_UP_TO)}: {name} ≤ {bound:g}x native latency"
    cases = [(b, a) for b, a in sizes.items() if b <= SMALL_UP_TO and name in a and "native" in a]
    if not cases:
        return result(text, None, detail=f"not measured (no {name} row ≤ {human(SMALL_UP_TO)})")
    b, a = max(cases, key=lambda c: c[1][name]["time_us"] / c[1]["native"]["time_us"])
    mine, native = a[name], a["native"]
    ratio = mine["time_us"] / native["time_us"]
    met = ratio <= bound
    extra = ""
    if "native persistent" in a:
        np_ = a["native persistent"]
        extra = f", native persistent {np_['time_us']:.1f} µs{span(us_range(np_), '.1f', ' µs')}"
    detail = (f"worst at {human(b)}: {name} {mine['time_us']:.1f} µs"
              f"{span(us_range(mine), '.1f', ' µs')}, native {native['time_us']:.1f} µs"
              f"{span(us_range(native), '.1f', ' µs')}{extra} = {ratio:.2f}x"
              f"{span(ratio_range(mine, native))}"
              + ("" if met else missed(ratio / bound - 1)))
    return result(text, met, ratio, b, detail)


def speedup(sizes: dict, which: str, lo: int, bound: float) -> dict:
    """Every size ≥ lo: native time / mpidp time ≥ bound, mpidp being the best or auto."""
    text = f"≥ {human(lo)}: {'best algorithm' if which == 'best' else 'auto'} ≥ {bound:g}x native"

    def pick(a):
        return best_mpidp(a) if which == "best" else a.get("auto")

    cases = [(b, pick(a), a["native"]) for b, a in sizes.items()
             if b >= lo and "native" in a and pick(a)]
    if not cases:
        return result(text, None, detail=f"not measured (no size ≥ {human(lo)})")
    b, mine, native = min(cases, key=lambda c: c[2]["time_us"] / c[1]["time_us"])
    ratio = native["time_us"] / mine["time_us"]
    met = ratio >= bound
    name = mine["algorithm"] + (f" ({mine['resolved']})" if which == "auto" else "")
    detail = (f"worst at {human(b)}: {name} {ratio:.2f}x native{span(ratio_range(native, mine))}"
              + ("" if met else missed(1 - ratio / bound)))
    return result(text, met, ratio, b, detail)


def auto_vs_best(sizes: dict) -> dict:
    """Every size: auto's time ≤ (1 + max(10%, spread)) × the best algorithm's."""
    text = f"every size: auto within {100 * AUTO_SLACK:.0f}% of the best algorithm (or the spread)"
    cases = []
    for b, a in sizes.items():
        best = best_mpidp(a)
        if "auto" in a and best:
            allowed = 1 + max(AUTO_SLACK, a["auto"].get("spread", 0), best.get("spread", 0))
            cases.append((b, a["auto"], best, allowed))
    if not cases:
        return result(text, None, detail="not measured")
    b, auto, best, allowed = max(cases, key=lambda c: c[1]["time_us"] / c[2]["time_us"] / c[3])
    ratio = auto["time_us"] / best["time_us"]
    met = ratio <= allowed
    detail = (f"worst at {human(b)}: auto ({auto.get('resolved') or '?'}) {ratio:.2f}x the time "
              f"of {best['algorithm']}{span(ratio_range(auto, best))}, allowed {allowed:.2f}x"
              + ("" if met else missed(ratio / allowed - 1)))
    return result(text, met, ratio, b, detail)


def evaluate(collective: str, sizes: dict) -> list[dict]:
    """Issue 18's targets for one (collective, placement): {bytes: {name: row}}."""
    out = []
    if collective == "allreduce":
        out += [latency(sizes, "auto persistent", 1.5), latency(sizes, "auto", 2.0)]
    if collective in ("allreduce", "reduce_scatter"):
        out += [speedup(sizes, w, MIB, 1.0) for w in ("best", "auto")]
    if collective == "allreduce":
        out += [speedup(sizes, w, 16 * MIB, 1.5) for w in ("best", "auto")]
    if collective in ("allgather", "bcast"):
        out += [speedup(sizes, w, MIB, 0.95) for w in ("best", "auto")]
    return [*out, auto_vs_best(sizes)]


def judged(ranks: int) -> bool:
    return ranks in JUDGED_RANKS


def status(met: bool | None, ranks: int) -> str:
    if met is None:
        return "not measured"
    word = "met" if met else "missed"
    return (word if met else f"**{word}**") if judged(ranks) else f"not a target ({word})"


def before(now: dict, then: dict | None) -> str:
    """The same target on the previously committed figures, and whether it fell below them."""
    if then is None or then["worst"] is None:
        return "—"
    text = f"{then['worst']:.2f}x at {human(then['at'])}"
    if now["worst"] is None:
        return text
    lower_is_better = "latency" in now["target"] or "within" in now["target"]
    worse = now["worst"] > then["worst"] if lower_is_better else now["worst"] < then["worst"]
    return text + (" (**now worse**)" if worse else " (now as good or better)")
