"""docs/simulator.md shows what the program prints: every `$ python -m mpidp.sim` block is rerun
(the slow ones on fewer ranks, their rows compared), and the page's Python calls work.

`python -m mpidp.sim.page docs/simulator.md` (`make sim-page`) rewrites the blocks.
"""

import os
import re
import subprocess
import sys
import types

import pytest

from mpidp.sim import page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "docs", "simulator.md")
with open(PATH, encoding="utf-8") as f:
    TEXT = f.read()
BLOCKS = {command: output for _, _, command, output in page.blocks(TEXT)}
# too slow for the suite in full: (the page's --ranks, fewer ranks whose rows must be on it)
SLOW = {"volume": ("2,4,8,16,32,64,128,256,512,1024", "2,4,64"), "check": ("1-64", "1-8")}


def slow(command: str):
    """(the page's --ranks, the fewer ones) if `command` is too slow to rerun in full."""
    kind = command.split()[3]
    return SLOW.get(kind) if kind != "check" or "my_allreduce" in command else None


def test_the_page_has_its_blocks():
    kinds = {command.split()[3] for command in BLOCKS}
    assert kinds == {"table", "check", "volume", "predict"}, kinds
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("command", [c for c in BLOCKS if not slow(c)])
def test_a_block_is_what_the_program_prints(command):
    printed = page.run(command, page.example(TEXT))
    assert page.same(BLOCKS[command], printed), f"the page shows\n{BLOCKS[command]}\n\n" \
        f"the program prints\n{printed}\n\n(make sim-page rewrites it)"


def rows(text: str) -> set[str]:
    """The table rows and table heads of an output."""
    return {line.rstrip() for line in text.splitlines() if "|" in line}


@pytest.mark.parametrize("command", [c for c in BLOCKS if slow(c)])
def test_a_slow_block_has_the_rows_the_program_prints_on_fewer_ranks(command):
    full, fewer = slow(command)
    assert f"--ranks {full}" in command
    printed = page.run(command.replace(f"--ranks {full}", f"--ranks {fewer}"),
                       page.example(TEXT))
    missing = rows(printed) - rows(BLOCKS[command])
    assert rows(printed) and not missing, f"not on the page: {sorted(missing)}"


def test_the_page_s_python_calls_work():
    """`mpidp.sim.check(allreduce, "allreduce", range(1, 65))` as the page writes it (fewer
    ranks), with the worked example's function, and `simulate` as its first example."""
    code = re.search(r"`(mpidp\.sim\.check\(allreduce, \"allreduce\", range\(1, 65\)\))`",
                     TEXT).group(1)
    module = types.ModuleType("my_allreduce")
    exec(page.example(TEXT)["my_allreduce.py"], module.__dict__)
    import mpidp.sim

    report = eval(code.replace("range(1, 65)", "range(1, 6)"),
                  {"mpidp": mpidp, "allreduce": module.allreduce})
    assert report.ok and report.cases == 60 and ".ok" in TEXT and ".failure" in TEXT
    first = re.search(r"```python\n(from mpidp.sim import simulate\n.*?)```", TEXT, re.S)
    scope: dict = {}
    for line in first.group(1).splitlines():
        code_part = line.split("#")[0].strip()
        if code_part:
            exec(code_part, scope)
    assert scope["out"].problems() == [] and scope["out"].sim.bytes_sent[0] == 7000


def test_the_command_line_name_still_works():
    done = subprocess.run([sys.executable, "-m", "mpidp.sim", "check", "ring", "--ranks", "1-3",
                           "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok: " in done.stdout, done.stdout + done.stderr
