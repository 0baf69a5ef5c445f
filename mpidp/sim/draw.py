"""Pictures of a schedule: `python -m mpidp.sim draw ALGORITHM --ranks N -o FILE.png`.

One panel per step, after a first one for the start. Each rank is a row of its
blocks; an arrow is a message of that step, labelled with its blocks (the step
table's notation). A block's shade says how many ranks' contributions it holds
after the step; a block that holds all N (reduced, or for all-gather and
broadcast: arrived) is outlined. To know the contributions, the schedule runs
on bit masks: rank r's input has bit r set, and the op is bitwise or.
"""

from __future__ import annotations

import os

import numpy as np

from .collective import REDUCING, layout, simulate
from .engine import TIMEOUT
from .table import default_count, label


def contributions(collective: str, buf, blocks, N: int) -> list[int]:
    """Per block: how many ranks' inputs it holds (the fewest over its items)."""
    out = []
    for b in range(len(blocks)):
        items = [int(v) for v in blocks.view(buf, b)]
        if not items:
            out.append(0)
        elif collective in REDUCING:  # or-ed bit masks: count the bits
            out.append(min(bin(v).count("1") for v in items))
        else:  # copies of one rank's data: a power of two, or the sentinel (not arrived)
            out.append(N if all(v and not v & (v - 1) for v in items) else 0)
    return out


def run(algorithm, collective: str, N: int, count: int | None = None, timeout=TIMEOUT):
    """The outcome (with its trace) and, for t = 0 .. steps, the contributions per rank and
    block after step t - 1."""
    if N > 62:
        raise ValueError("draw takes at most 62 ranks (one bit per rank of an int64)")
    count = default_count(N) if count is None else count
    blocks = layout(collective, N, count)
    sizes = blocks.counts if collective == "allgather" else [blocks.total] * N
    inputs = [np.full(sizes[r], 1 << r, np.int64) for r in range(N)]
    snapshots = []

    def on_step(sim, step: int) -> None:
        snapshots.append([contributions(collective, sim.where[r]["buf"], blocks, N)
                          for r in range(N)])

    out = simulate(collective, algorithm, N, count, inputs=inputs, op="bor", in_place=True,
                   trace=True, on_step=on_step, max_steps=8 * N * N + 1000, timeout=timeout)
    return out, snapshots


def lanes(pairs: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """A lane (a column right of the blocks) for each pair of ranks (lo, hi) that exchange in
    a step: pairs whose spans of rows overlap get different lanes, the others share one."""
    ends: list[int] = []  # the last row used in each lane
    out = {}
    for lo, hi in sorted(set(pairs)):
        lane = next((k for k, end in enumerate(ends) if end < lo), len(ends))
        if lane == len(ends):
            ends.append(hi)
        ends[lane] = hi
        out[lo, hi] = lane
    return out


def draw(algorithm, collective: str, N: int, path: str, count: int | None = None,
         timeout=TIMEOUT) -> None:
    """Write the picture of `algorithm` on N ranks to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch, Rectangle

    out, snaps = run(algorithm, collective, N, count, timeout)
    nb, panels = len(out.blocks), len(snaps)
    cols = min(panels, 4)
    rows = -(-panels // cols)
    width = 0.4 * nb * cols + 2.4 * cols
    fig, axes = plt.subplots(rows, cols, figsize=(width, 0.5 * N * rows + 2.0), squeeze=False)
    shade = plt.get_cmap("Blues")

    def face(held: int):
        return shade(0.2 + 0.7 * held / N) if held else "white"

    x = nb + 0.4  # where the arrows run, right of the blocks
    arrow = "C3"  # one colour: every arrow is a message
    for k, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if k >= panels:
            continue
        ax.set_title("start" if k == 0 else f"step {k - 1}", fontsize=10)
        for r in range(N):
            y = N - 1 - r
            ax.text(-0.2, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=8)
            for b, held in enumerate(snaps[k][r]):
                ax.add_patch(Rectangle((b, y), 0.9, 0.8, facecolor=face(held), linewidth=1.5 if
                                       held == N else 0.5, edgecolor="black" if held == N else
                                       "0.7"))
                ax.text(b + 0.45, y + 0.4, str(b), ha="center", va="center", fontsize=6,
                        color="white" if held > 0.6 * N else "black")
        step_events = [e for e in out.sim.events if e[0] == k - 1]
        lane = lanes([(min(e[1], e[2]), max(e[1], e[2])) for e in step_events])
        for _, src, dst, sbuf, *_ in step_events:
            down = src < dst  # a swap's two arrows side by side, each label on its outer side
            xa = x + 1.1 * lane[min(src, dst), max(src, dst)] + (0.35 if down else 0.55)
            ys, yd = N - 1 - src + 0.4, N - 1 - dst + 0.4
            ax.add_patch(FancyArrowPatch((xa, ys), (xa, yd), arrowstyle="-|>", mutation_scale=8,
                                         color=arrow, linewidth=0.9, shrinkA=3, shrinkB=3))
            ax.text(xa + (-0.05 if down else 0.05), (ys + yd) / 2, label(out, src, sbuf),
                    fontsize=6, color=arrow, va="center", ha="right" if down else "left")
        ax.set_xlim(-1.7, x + 1.1 * max(max(lane.values(), default=0) + 1, 2) + 0.3)
        ax.set_ylim(-0.3, N + 0.1)
    fig.suptitle(f"{out.name} ({collective}), N = {N}", fontsize=11)
    # the key, below the panels (never on them): the shades, the outline, the arrows
    fig.tight_layout(rect=(0, 0.12, 1, 0.97))
    bar = fig.add_axes((0.08, 0.045, 0.3, 0.022))
    levels = np.arange(0.5, N + 1.5)
    fig.colorbar(ScalarMappable(BoundaryNorm(levels, N), _shades(face, N)), cax=bar,
                 orientation="horizontal", ticks=range(1, N + 1) if N <= 8 else
                 sorted({1, (N + 1) // 2, N}))
    bar.set_title("ranks' inputs a block holds (the schedule runs on bit masks)", fontsize=8)
    bar.tick_params(labelsize=7)
    fig.legend(handles=[Rectangle((0, 0), 1, 1, facecolor=face(N), edgecolor="black",
                                  linewidth=1.5, label=f"all {N}: complete"),
                        Line2D([], [], color=arrow, marker=">", markersize=5,
                               label="a message, labelled with the sender's blocks")],
               loc="lower left", bbox_to_anchor=(0.45, 0.01), ncol=2, fontsize=8, frameon=False)
    from .. import files

    ext = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    try:  # atomically, by the one writer (a FIFO or device at `path` is refused)
        files.replace(path, lambda f: fig.savefig(f, dpi=130, format=ext))
    finally:
        plt.close(fig)


def _shades(face, N: int):
    """The colour map of the blocks' shades, one colour per count 1..N."""
    from matplotlib.colors import ListedColormap

    return ListedColormap([face(held) for held in range(1, N + 1)])
