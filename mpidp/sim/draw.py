"""Pictures of a schedule: `python -m mpidp.sim draw ALGORITHM --ranks N -o FILE.png`.

One panel per step, after a first one for the start. Each rank is a row of its
blocks; an arrow is a message of that step, labelled with its blocks (the step
table's notation). A block's shade says how many ranks' contributions it holds
after the step; a block that holds all N (reduced, or for all-gather and
broadcast: arrived) is outlined. To know the contributions, the schedule runs
on bit masks: rank r's input has bit r set, and the op is bitwise or.
"""

from __future__ import annotations

import numpy as np

from .collective import REDUCING, layout, simulate
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


def run(algorithm, collective: str, N: int, count: int | None = None):
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
                   trace=True, on_step=on_step)
    return out, snapshots


def draw(algorithm, collective: str, N: int, path: str, count: int | None = None) -> None:
    """Write the picture of `algorithm` on N ranks to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    out, snaps = run(algorithm, collective, N, count)
    nb, panels = len(out.blocks), len(snaps)
    cols = min(panels, 4)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(0.4 * nb * cols + 2.0 * cols,
                                                  0.5 * N * rows + 1.0), squeeze=False)
    shade = plt.get_cmap("Blues")
    x = nb + 0.3  # where the arrows run, right of the blocks
    for k, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if k >= panels:
            continue
        ax.set_title("start" if k == 0 else f"step {k - 1}", fontsize=10)
        for r in range(N):
            y = N - 1 - r
            ax.text(-0.2, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=8)
            for b, held in enumerate(snaps[k][r]):
                face = shade(0.2 + 0.7 * held / N) if held else "white"
                ax.add_patch(Rectangle((b, y), 0.9, 0.8, facecolor=face, linewidth=1.5 if
                                       held == N else 0.5, edgecolor="black" if held == N else
                                       "0.7"))
                ax.text(b + 0.45, y + 0.4, str(b), ha="center", va="center", fontsize=6,
                        color="white" if held > 0.6 * N else "black")
        lanes: dict = {}  # one lane per pair of ranks; a swap's two arrows side by side
        for step, src, dst, sbuf, *_ in out.sim.events:
            if step != k - 1:
                continue
            lane = lanes.setdefault((min(src, dst), max(src, dst)), len(lanes))
            down = src < dst
            xa = x + 0.75 * lane + (0 if down else 0.22)
            ys, yd = N - 1 - src + 0.4, N - 1 - dst + 0.4
            ax.add_patch(FancyArrowPatch((xa, ys), (xa, yd), arrowstyle="-|>", mutation_scale=8,
                                         color="C3", linewidth=0.9, shrinkA=3, shrinkB=3))
            ax.text(xa + 0.06, (ys + yd) / 2 + (0.18 if down else -0.18), label(out, src, sbuf),
                    fontsize=6, color="C3", va="center")
        ax.set_xlim(-1.7, x + 0.75 * max(len(lanes), 2) + 0.6)
        ax.set_ylim(-0.3, N + 0.1)
    fig.suptitle(f"{collective} {out.name}, N = {N}: the shade counts the ranks' inputs a block "
                 "holds; outlined: all N", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
