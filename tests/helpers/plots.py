"""Checks that a matplotlib figure is readable: a key on every panel, one colour per series,
colours that look different (CIELAB distance), and no key drawn over the data.

`drawn(monkeypatch)` catches the figures a plotting function saves, without changing it.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

MIN_DELTA_E = 20.0  # CIE76 distance below which two keyed colours read as one (about 2.3: just
# noticeable side by side; thin lines in a key need far more)


def lab(hex_colour: str) -> tuple[float, float, float]:
    """sRGB -> CIELAB (D65): a space where distance is roughly how different colours look."""
    from matplotlib.colors import to_rgb

    r, g, b = (((v + 0.055) / 1.055) ** 2.4 if v > 0.04045 else v / 12.92
               for v in to_rgb(hex_colour))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t):
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def alike(keyed: dict[str, str]) -> list[tuple[str, str, float]]:
    """The pairs of keyed series whose colours are closer than MIN_DELTA_E."""
    import itertools
    import math

    return [(a, b, round(math.dist(lab(ca), lab(cb)), 1))
            for (a, ca), (b, cb) in itertools.combinations(keyed.items(), 2)
            if ca != cb and math.dist(lab(ca), lab(cb)) < MIN_DELTA_E]


def drawn(monkeypatch) -> list[Figure]:
    """The figures saved from now on (each still written to its file)."""
    figures = []
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):
        figures.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def colour(artist) -> str:
    if isinstance(artist, Line2D):
        return to_hex(artist.get_color())
    return to_hex(artist.get_facecolor())


def series(ax) -> dict[str, set[str]]:
    """Each labelled series of the panel -> the colours it is drawn in."""
    found: dict[str, set[str]] = {}
    for line in ax.get_lines():
        if not line.get_label().startswith("_"):
            found.setdefault(line.get_label(), set()).add(colour(line))
    for container in ax.containers:
        if not container.get_label().startswith("_"):
            for patch in container:
                found.setdefault(container.get_label(), set()).add(colour(patch))
    return found


def data_boxes(fig, ax) -> list:
    """The display-space boxes of the panel's data: every point of its lines, every bar."""
    boxes = []
    for line in ax.get_lines():
        if line.get_label().startswith("_"):  # a guide (axvline), not a series
            continue
        for x, y in ax.transData.transform(line.get_xydata()):
            boxes.append((x, y, x, y))
    for patch in ax.patches:
        if isinstance(patch, Rectangle):
            b = patch.get_window_extent(fig.canvas.get_renderer())
            boxes.append((b.x0, b.y0, b.x1, b.y1))
    return boxes


def problems(fig, same_colours_across_panels: bool = True) -> list[str]:
    """What makes `fig` hard to read (empty: nothing)."""
    if not hasattr(fig.canvas, "get_renderer"):  # closed (plt.close) after saving
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found, everywhere = [], {}
    for i, ax in enumerate(fig.axes):
        name = f"panel {i} ({ax.get_title()!r})"
        legends = [ax.get_legend()] if ax.get_legend() else (
            list(fig.legends) if len(fig.axes) == 1 else [])
        if not legends:
            found.append(f"{name}: no legend")
            continue
        keyed = {}
        for legend in legends:
            for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
                if isinstance(handle, (Line2D, Patch)):
                    keyed[text.get_text()] = colour(handle)
        if len(set(keyed.values())) < len(keyed):
            found.append(f"{name}: two series share a colour in the key: {keyed}")
        for a, b, delta in alike(keyed):
            found.append(f"{name}: {a} and {b} are hard to tell apart (delta E {delta})")
        for label, colours in series(ax).items():
            if len(colours) > 1:
                found.append(f"{name}: {label} in several colours {colours}")
            elif label not in keyed:
                found.append(f"{name}: {label} is not in the key")
            elif colours != {keyed[label]}:
                found.append(f"{name}: {label} drawn {colours}, keyed {keyed[label]}")
            if same_colours_across_panels:
                if everywhere.setdefault(label, colours) != colours:
                    found.append(f"{name}: {label} is {colours} here, {everywhere[label]} "
                                 "elsewhere")
        drawn_colours = {colour(line) for line in ax.get_lines()
                         if not line.get_label().startswith("_")}
        bars = {colour(patch) for patch in ax.patches if isinstance(patch, Rectangle)}
        for label, c in keyed.items():
            if c not in drawn_colours | bars:
                found.append(f"{name}: the key lists {label}, which is not drawn")
        for c in bars - set(keyed.values()):
            found.append(f"{name}: bars in {c}, a colour the key does not name")
        for legend in legends:
            key = legend.get_window_extent(renderer)
            covered = [b for b in data_boxes(fig, ax) if b[0] < key.x1 and b[2] > key.x0
                       and b[1] < key.y1 and b[3] > key.y0]
            if covered:
                found.append(f"{name}: the key covers {len(covered)} data points or bars")
    return found
