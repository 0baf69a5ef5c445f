"""mpidp's imports as a whole: no circle, and the modules beneath everything stay beneath.

Parsed from the source, as tests/test_collectives_imports.py parses the call path (whose
finer rules are there; the textbook's are in tests/test_algorithms_imports.py): every
module-level import of an mpidp module is an arrow. docs/architecture.md states these
rules; this file is what holds them.
"""

from __future__ import annotations

from test_collectives_imports import ROOT, imported, module_name

# imported by everything, importing (of mpidp) only each other: docs/architecture.md
BENEATH = {"mpidp.arrays", "mpidp.config", "mpidp.files", "mpidp.untrusted", "mpidp.flight",
           "mpidp.recorder",
           "mpidp.commid", "mpidp.units",
           "mpidp.farewell", "mpidp.trace", "mpidp.timeline"}


def graph() -> dict[str, set[str]]:
    """module -> the mpidp modules it imports at module level (``from pkg import name``: the
    module pkg.name where there is one, else pkg)."""
    modules = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    arrows = {}
    for name, path in modules.items():
        out = set()
        for target, inner, _ in imported(path):
            while target not in modules and "." in target:  # a name, not a module
                target = target.rsplit(".", 1)[0]
            if not inner and target in modules and target != name:
                out.add(target)
        arrows[name] = out
    return arrows


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, found, counter = {}, {}, [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        for w in arrows.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while group[-1:] != [v]:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def test_no_circle_of_imports_in_mpidp():
    arrows = graph()
    assert len(arrows) > 50 and arrows["mpidp.training.ddp"], "the parse found the package"
    assert not circles(arrows), circles(arrows)


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_modules_beneath_everything_import_only_each_other():
    arrows = graph()
    assert BENEATH <= arrows.keys()
    above = {m: sorted(arrows[m] - BENEATH) for m in BENEATH if arrows[m] - BENEATH}
    assert not above, f"imports from above: {above}"


def reachable(arrows: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in arrows.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_simulator_stands_below_the_benchmarks():
    """mpidp.sim imports nothing of mpidp.bench, at module level or inside a function,
    directly or through another module (docs/architecture.md: sim below bench)."""
    arrows = graph()
    sims = [m for m in arrows if m == "mpidp.sim" or m.startswith("mpidp.sim.")]
    assert len(sims) > 5, "the parse found the simulator"
    up = {m: sorted(w for w in reachable(arrows, m) if w.split(".")[:2] == ["mpidp", "bench"])
          for m in sims}
    inner = {module_name(p): t for p in sorted((ROOT / "sim").rglob("*.py"))
             for t, _, _ in imported(p) if t.split(".")[:2] == ["mpidp", "bench"]}
    assert not {m: w for m, w in up.items() if w} and not inner, (up, inner)


def test_no_module_of_mpidp_is_over_300_lines():
    """Short modules (DESIGN.md's house style): split by concept before one passes 300."""
    long = {module_name(p): n for p in sorted(ROOT.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) >= 300}
    assert not long, long
