"""Every command the docs show runs a program that takes its flags.

The commands are the lines of README.md's and docs/*.md's code blocks (fenced, or
indented four spaces) that run an mpidp program or example, a prompt (``$ ``), variables
(``MPIDP_TIMEOUT=5``), a comment and a redirection aside, continued lines joined. The
launcher is stripped (``mpiexec ... -n N``, ``python -m mpidp``, ``python -m
mpidp.cluster run ... --``, each of those checked on the way), then the program's own
parser reads the flags, in this process: a flag that the program does not take, or a
value it refuses, fails here with the program's own message. Only argparse's reading is
checked, not what the program does next (the docs show some errors on purpose). `make`
lines name a target of the Makefile. A synopsis (``[--max BYTES]``, ``N,...``, upper-case
placeholders) is a pattern, not a command: skipped.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import re
import runpy
import shlex

import pytest

import mpidp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
RUNS = re.compile(r"(^|[\s/])(python3?|mpiexec|make)\s")
PROGRAM = re.compile(r"examples/\w+\.py|-m mpidp\b|^make\s")
SYNOPSIS = re.compile(r"\[|\.\.\.|<|\b[A-Z][A-Z_]{1,}\b(?!=)|\|")


def blocks(text: str) -> list[str]:
    """The code blocks of a Markdown page: fenced ones, then runs of indented lines."""
    found = [m.group(1) for m in FENCE.finditer(text)]
    outside = FENCE.sub("", text)
    found += [m.group(0) for m in re.finditer(r"(?:^(?: {4}|\t).*\n?)+", outside, re.M)]
    return found


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every command in the pages' code blocks that runs mpidp."""
    found = []
    for page in PAGES:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for block in blocks(text):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.strip()
                line = line[2:] if line.startswith("$ ") else line
                line = re.sub(r"\s#.*$", "", line).split(" < ")[0].split(" > ")[0].strip()
                if not RUNS.search(" " + line) or not PROGRAM.search(line):
                    continue
                if SYNOPSIS.search(line.replace("MPIDP_", "")):
                    continue
                try:
                    argv = shlex.split(line)
                except ValueError:  # not shell: a line of Python or prose in a block
                    continue
                while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value
                    argv.pop(0)
                if argv and os.path.basename(argv[0]) in ("python", "python3", "mpiexec",
                                                          "make"):
                    found.append((f"{page}: {line}", argv))
    return found


class Parsed(Exception):  # noqa: N818 - not an error: the program's parser accepted the flags
    """Raised by the patched ``parse_args`` once the program's parser has read its flags."""


@pytest.fixture
def parse_only(monkeypatch):
    """``ArgumentParser.parse_args`` reads the flags as the program would, then stops it."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)


def strip_launcher(argv: list[str]) -> list[str]:
    """``mpiexec [flags] -n N rest`` -> ``rest``; anything else as it is."""
    if os.path.basename(argv[0]) != "mpiexec":
        return argv
    for i, word in enumerate(argv):
        if word in ("-n", "-np") and i + 1 < len(argv):
            assert argv[i + 1].isdigit(), argv
            return argv[i + 2:]
    raise AssertionError(f"an mpiexec line without -n N: {argv}")


def make_targets() -> set[str]:
    with open(os.path.join(ROOT, "Makefile")) as f:
        return set(re.findall(r"^([a-z][\w-]*):", f.read(), re.M))


def check(argv: list[str]) -> None:
    """Raise AssertionError unless `argv`'s program takes its flags."""
    argv = strip_launcher(argv)
    if os.path.basename(argv[0]) == "make":
        assert argv[1] in make_targets(), f"no target {argv[1]!r} in the Makefile"
        return
    assert os.path.basename(argv[0]) in ("python", "python3"), argv
    if argv[1] == "-m":
        module, args = argv[2], argv[3:]
    else:
        module, args = argv[1], argv[2:]
    if module == "mpidp":  # the launcher: a script or -m module (or -c code), then its args
        if args[0] == "-c":
            return
        if args[0] == "-m" or os.path.exists(os.path.join(ROOT, args[0])):
            return check(["python", *args])
        assert args[0].endswith(".py"), args  # the user's own script: nothing more to read
        return
    if module.endswith(".py"):  # an example
        return check_example(module, args)
    run_main(module, args)
    if module == "mpidp.cluster" and "--" in args:  # then the command it runs on the hosts
        check(args[args.index("--") + 1:])


def run_main(module: str, args: list[str]) -> None:
    try:  # `python -m package` runs package/__main__.py
        main = importlib.import_module(module + ".__main__").main
    except ModuleNotFoundError:
        main = importlib.import_module(module).main
    try:
        main(args)
    except Parsed:
        return
    except SystemExit as e:
        raise AssertionError(f"{module} refused {args}: exit {e.code}") from None
    except Exception as e:  # noqa: BLE001 - a parser of its own kind (the trainers' UsageError)
        raise AssertionError(f"{module} refused {args}: {e!r}") from None
    raise AssertionError(f"{module} {args}: returned without reading its flags")


def check_example(path: str, args: list[str]) -> None:
    full = os.path.join(ROOT, path)
    assert os.path.exists(full), f"no {path}"
    name = os.path.basename(path)
    if name == "dropin.py":  # one optional argument: the all-reduce algorithm
        assert len(args) <= 1 and (not args or args[0] in mpidp.ALGORITHMS["allreduce"]), args
        return
    if name in ("ring_walkthrough.py", "gpu_check.py"):
        assert not args, f"{name} takes no arguments: {args}"
        return
    namespace = runpy.run_path(full, run_name="docs_commands")  # defines, runs nothing
    try:
        namespace["parse_args"](args)
    except Parsed:
        return
    except SystemExit as e:
        raise AssertionError(f"{path} refused {args}: exit {e.code}") from None
    except Exception as e:  # noqa: BLE001 - a parser of its own kind (the trainers' UsageError)
        raise AssertionError(f"{path} refused {args}: {e!r}") from None
    raise AssertionError(f"{path} {args}: returned without reading its flags")


COMMANDS = commands()


def test_the_docs_show_commands_of_every_kind():
    """The reader finds what it checks (a broken reader would pass everything)."""
    shown = " ".join(where for where, _ in COMMANDS)
    for kind in ("examples/train_mlp.py", "examples/train_gpt.py", "-m mpidp.sim",
                 "-m mpidp.cluster", "-m mpidp.doctor", "-m mpidp.trace", "make demo"):
        assert kind in shown, kind
    assert len(COMMANDS) >= 30, len(COMMANDS)


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where, argv, parse_only, capsys):
    try:
        check(argv)
    except AssertionError as e:
        raise AssertionError(f"{where}\n{e}\n{capsys.readouterr().err}") from None


def test_a_wrong_flag_is_caught(parse_only, capsys):
    """The check fails where the program would: an unknown flag, a bad value."""
    for argv in (["python", "examples/train_mlp.py", "--epochz", "3"],
                 ["mpiexec", "-n", "2", "python", "-m", "mpidp.bench", "exact",  # not a launch
                  "--repeats", "x"],
                 ["python", "-m", "mpidp.sim", "table", "ring", "--ranks", "four"],
                 ["make", "benchmark"]):
        with pytest.raises(AssertionError):
            check(argv)


def test_the_package_version_is_not_older_than_the_changelogs_newest_entry():
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        newest = re.search(r"^## (\d+)\.(\d+)\.(\d+)", f.read(), re.M)
    assert newest, "CHANGELOG.md: no '## X.Y.Z' entry"
    version = tuple(int(v) for v in mpidp.__version__.split("."))
    assert version >= tuple(int(v) for v in newest.groups()), (mpidp.__version__, newest[0])


def readme_snippet() -> str:
    """The Python block under README.md's "Using the collectives"."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## Using the collectives", 1)[1]
    return re.search(r"^```python\n(.*?)^```", section, re.M | re.S).group(1)


@pytest.mark.mpi(ranks=[3], timeout=90)
def test_the_readme_snippet_runs_and_prints_what_it_checked(mpi_ranks, capsys, no_debug_check):
    """As a user runs it (MPIDP_DEBUG off: its agreement check would be counted)."""
    from mpi4py import MPI

    code = compile(readme_snippet(), "<README.md: Using the collectives>", "exec")
    exec(code, {"__name__": "__main__"})
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert out.startswith("3 ranks: ") and "checked" in out, out
    else:
        assert out == "", out
