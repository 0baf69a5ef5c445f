"""The waits-for graph as a picture: ranks on a circle, an arrow a -> b for each wait.

An arrow from rank a to rank b says a waits, in the round of the collective on
its label, for a message from (or to) b. Ranks the cause names are red, ranks
whose program ended ringed green, ranks with no record grey and dashed; a cycle's arrows
are drawn thicker. The key lists only what the picture holds.
"""

from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .. import files  # noqa: E402


def draw(d: dict, path: str) -> None:
    """Draw the diagnosis `d`'s waits-for graph to `path` (PNG, SVG or PDF, by its name),
    through the one writer (`mpidp.files`)."""
    n = d["size"]
    pos = {r: (math.sin(2 * math.pi * r / n), math.cos(2 * math.pi * r / n)) for r in range(n)}
    fig, ax = plt.subplots(figsize=(6.5, 6.5))
    in_cycle = {pair for c in d["cycles"] for pair in zip(c, c[1:] + c[:1], strict=True)}
    labels: dict[tuple, list[str]] = {}
    for e in d["edges"]:
        labels.setdefault((e["from"], e["to"]), []).append(e["label"])
    for (a, b), texts in labels.items():
        (x0, y0), (x1, y1) = pos[a], pos[b]
        bend = 0.2 if (b, a) in labels else 0.0  # two ways: two arcs, not one line
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "-|>", "lw": 2.4 if (a, b) in in_cycle else 1.2,
                                "color": "tab:blue", "shrinkA": 16, "shrinkB": 16,
                                "connectionstyle": f"arc3,rad={bend}"})
        # on the arc (matplotlib's arc3: a quadratic Bezier through this control point), a
        # third of the way from the waiting rank: labels of arrows crossing at the centre
        # stay apart
        cx, cy = (x0 + x1) / 2 + bend * (y1 - y0), (y0 + y1) / 2 - bend * (x1 - x0)
        t = 1 / 3
        mx = (1 - t) ** 2 * x0 + 2 * t * (1 - t) * cx + t * t * x1
        my = (1 - t) ** 2 * y0 + 2 * t * (1 - t) * cy + t * t * y1
        ax.text(mx, my, "\n".join(sorted(set(texts))), fontsize=7, ha="center",
                va="center", color="tab:blue",
                bbox={"boxstyle": "round", "fc": "white", "ec": "none", "alpha": 0.8})
    cause = set(d["cause"]["ranks"])
    finished = {r for r, w in d["where"].items() if w["kind"] == "finished"}
    for r, (x, y) in pos.items():
        missing = r in d["missing"]
        ax.scatter([x], [y], s=900, zorder=3, color="lightgrey" if missing else
                   "tab:red" if r in cause else "white",
                   edgecolors="grey" if missing else "tab:green" if r in finished else "black",
                   linestyles="dashed" if missing else "solid",
                   linewidths=4 if r in finished else 1.5)
        ax.text(x, y, str(r), ha="center", va="center", zorder=4, fontsize=11,
                color="white" if r in cause and not missing else "black")
    # a key for what the picture holds, and only that
    if cause:
        ax.scatter([], [], s=120, color="tab:red", edgecolors="black", label="named by the cause")
    if finished:
        ax.scatter([], [], s=120, color="white", edgecolors="tab:green", linewidths=3,
                   label="finished")
    if d["missing"]:
        ax.scatter([], [], s=120, color="lightgrey", edgecolors="grey", label="no record")
    ax.plot([], [], color="tab:blue", label="waits for (collective #, round)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(_wrap("cause: " + d["cause"]["text"], 90), fontsize=8, loc="left")
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.set_aspect("equal")
    ax.axis("off")
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    try:
        files.replace(path, lambda f: fig.savefig(f, format=fmt, dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line][:6])
