"""algorithms/ is the textbook: every file in it imports only its own folder, NumPy and a
few standard-library modules of vocabulary (no MPI, nothing of the call path or the engine).

The imports are read from the source (`ast`), top-level and inside functions alike.
"""

import ast
import pathlib

import mpidp.collectives.algorithms as algorithms

FOLDER = pathlib.Path(algorithms.__file__).parent
# what a textbook file may import besides its own folder: NumPy, and standard-library
# modules for types, small containers and exact arithmetic (prerounding.py's bounds)
ALLOWED = {"numpy", "__future__", "collections", "dataclasses", "fractions", "functools",
           "itertools", "sys", "typing"}


def outside(path: pathlib.Path) -> list[str]:
    """The imports of `path` that leave the folder and are not in ALLOWED."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from . import x, from .rounds import Send: the folder
                continue
            names = ["." * node.level + (node.module or "")]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "__import__"):  # ops._xp's CuPy, the one lazy import
            names = [node.args[0].value if isinstance(node.args[0], ast.Constant) else "?"]
            if names == ["cupy"]:
                continue
        else:
            continue
        found += [f"{path.name}:{node.lineno}: {name}" for name in names
                  if name.split(".")[0] not in ALLOWED]
    return found


def test_the_textbook_imports_nothing_outside_its_folder():
    files = sorted(FOLDER.glob("*.py"))
    assert len(files) >= 10, files  # the folder was found and read
    assert [line for path in files for line in outside(path)] == []


def test_an_import_from_outside_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from __future__ import annotations\nimport numpy as np\n"
                   "from .rounds import Send\nfrom ..placement import known\n"
                   "def f():\n    from mpi4py import MPI\n    import mpidp.arrays\n")
    assert outside(bad) == ["bad.py:4: ..placement", "bad.py:6: mpi4py",
                            "bad.py:7: mpidp.arrays"]
