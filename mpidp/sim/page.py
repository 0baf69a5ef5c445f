"""docs/simulator.md's outputs, printed by the program: regenerate them, or say where they drift.

    python -m mpidp.sim.page docs/simulator.md            # rerun every command, rewrite the page
    python -m mpidp.sim.page docs/simulator.md --check    # exit 1 if a block differs
    python -m mpidp.sim.page docs/simulator.md --skip volume   # all but the blocks of `volume`

A block is a fenced code block whose first line is ``$ python -m mpidp.sim ...``
(continued by lines ending in a backslash); what follows the command is its
output. The commands run from the repository root, with the page's worked example
(``my_allreduce.py``) and its broken copy (``broken.py``, the reduce-scatter one step
short) importable. A line ``(12.3 s)`` is the run's own time: it is rewritten, never
compared. `make sim-page` runs the first form; tests/test_sim_page.py runs the
fast blocks and checks the slow ones' rows on fewer ranks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap

from .. import files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FENCE = re.compile(r"^```[a-z]*\n(\$ python -m mpidp\.sim .*?)^```$", re.M | re.S)
TIME = re.compile(r"^\(\d+(\.\d+)? s\)$")  # a run's own time


def blocks(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, command, output) of every command block; start..end is the block's body."""
    out = []
    for m in FENCE.finditer(text):
        lines = m.group(1).splitlines()
        n = 1
        while lines[n - 1].endswith("\\"):
            n += 1
        command = " ".join(line.rstrip("\\").strip() for line in lines[:n])[2:]
        out.append((m.start(1), m.end(1), command, "\n".join(lines[n:])))
    return out


def example(text: str) -> dict[str, str]:
    """{file name: source} of the modules the page's commands import."""
    source = re.search(r"a file `my_allreduce.py`:\n\n```python\n(.*?)```", text, re.S).group(1)
    broken = source.replace("range(N - 1)", "range(N - 2)", 1)
    return {"my_allreduce.py": source, "broken.py": textwrap.dedent(broken)}


def run(command: str, modules: dict[str, str]) -> str:
    """The output of one page command (stdout, as the page shows it)."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "mpidp.sim"], command
    with tempfile.TemporaryDirectory() as where:
        for name, source in modules.items():
            files.write_text(os.path.join(where, name), source)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [where, ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=3600)
    if done.stderr.strip() or done.returncode not in (0, 1):
        raise RuntimeError(f"{command}: exit {done.returncode}\n{done.stderr}")
    return done.stdout.rstrip("\n")


def same(page: str, printed: str) -> bool:
    """The page's output equals the program's, the runs' own times aside."""
    def kept(text):
        return [line.rstrip() for line in text.splitlines() if not TIME.match(line.strip())]

    return kept(page) == kept(printed)


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    skip = args.pop(args.index("--skip") + 1) if "--skip" in args else None
    paths = [a for a in args if a not in ("--check", "--skip")] or \
        [os.path.join(ROOT, "docs", "simulator.md")]
    drift = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        modules, pieces, at = example(text), [], 0
        for start, end, command, output in blocks(text):
            if skip and skip in command:  # left as it is (a slow block, pasted from a run)
                continue
            printed = run(command, modules)
            if not same(output, printed):
                drift += 1
                print(f"{path}: the output of `{command}` differs from the page's")
            head = text[start:end].split("\n")
            n = 1
            while head[n - 1].endswith("\\"):
                n += 1
            pieces += [text[at:start], "\n".join(head[:n]), "\n", printed, "\n"]
            at = end
        pieces.append(text[at:])
        if not check:
            files.write_text(path, "".join(pieces))
    if check:
        return 1 if drift else 0
    print(f"rewrote {', '.join(paths)} ({drift} block(s) changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
