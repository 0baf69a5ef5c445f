"""The call path's imports read top-down: entry points -> plans -> plan -> engine, no circle.

Parsed from the source (no import is run): every ``import`` in mpidp/collectives/ outside
algorithms/ (the textbook, whose own test is about itself), wherever it stands in a file,
is an arrow from that module to the one it names. A circle, or an import put inside a
function to hide one, fails here with the modules that make it.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "mpidp"
PACKAGE = ROOT / "collectives"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[str, bool, str | None]]:
    """(module, inside a function?, the package if the name may be one of its names, not a
    module: ``from pkg import name``) for every import of an mpidp module in `path`."""
    tree = ast.parse(path.read_text())
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if n is not f}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from .m import name` names m; `from . import x`, a module x or a name of .
            if node.module:
                names = [(base, None)]
            else:
                names = [(f"{base}.{a.name}", base) for a in node.names]
        elif isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        else:
            continue
        found += [(name, id(node) in inner, package) for name, package in names
                  if name.startswith("mpidp")]
    return found


def call_path() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
            if "algorithms" not in p.relative_to(PACKAGE).parts}


def arrows() -> dict[str, set[str]]:
    """module -> the call-path modules it imports (``from pkg import name``: the module
    pkg.name, or else pkg itself)."""
    modules = call_path()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for target, _, package in imported(path):
            if target not in modules and package is not None:
                target = package
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (its modules in order), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_call_path_has_no_circle_of_imports():
    graph = arrows()
    assert "mpidp.collectives.api" in graph and graph["mpidp.collectives.api"], graph
    assert circle(graph) is None, " -> ".join(circle(graph))


def test_a_circle_is_found_where_there_is_one():
    """The search itself: it finds the circle it is given, and none in a chain."""
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("name", sorted(call_path()))
def test_no_mpidp_import_inside_a_function(name):
    lazy = [target for target, inside, _ in imported(call_path()[name]) if inside]
    assert not lazy, f"{name} imports {lazy} inside a function"


def test_the_engine_imports_nothing_of_the_call_path():
    """engine/ runs rounds and knows no call: it imports algorithms/ (the words of a round),
    arrays and config, never state, plan, plans, checks, cost, api or dropin."""
    for name, targets in arrows().items():
        if name.startswith("mpidp.collectives.engine"):
            outside = {t for t in targets if not t.startswith("mpidp.collectives.engine")}
            assert not outside, f"{name} imports {outside}"


def test_entry_points_come_before_plans_before_the_engine():
    """api (the functions) -> plans (each collective's plan) -> plan (Call, Plan) ->
    engine.driver: the arrows run this way and never back."""
    graph = arrows()
    c = "mpidp.collectives."
    assert c + "plans" in graph[c + "api"] and c + "plan" in graph[c + "api"]
    assert c + "plan" in graph[c + "plans"] and c + "exact" in graph[c + "plans"]
    assert c + "engine.driver" in graph[c + "plan"]
    for low, high in [("plans", "api"), ("exact", "api"), ("exact", "plans"), ("plan", "plans"),
                      ("plan", "api"), ("persistent", "api"), ("checks", "plan"),
                      ("cost", "plans"), ("state", "plan")]:
        assert c + high not in graph[c + low], f"{low} imports {high}"
