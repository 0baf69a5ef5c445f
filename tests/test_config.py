"""The MPIDP_* environment variables: every value each one takes, every error naming it,
one module reading them all, one table documenting them, and the launcher's exit 2."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from mpi4py import MPI

from mpidp import config
from mpidp.collectives import checks, cost
from mpidp.collectives.engine import completion
from mpidp.collectives.engine import staging as buffers

ROOT = pathlib.Path(__file__).resolve().parent.parent

VALUES = {  # (variable, text) -> the value it means
    ("MPIDP_DEBUG", ""): False, ("MPIDP_DEBUG", "0"): False, ("MPIDP_DEBUG", "false"): False,
    ("MPIDP_DEBUG", "No"): False, ("MPIDP_DEBUG", "OFF"): False, ("MPIDP_DEBUG", " off "): False,
    ("MPIDP_DEBUG", "1"): True, ("MPIDP_DEBUG", "TRUE"): True, ("MPIDP_DEBUG", "yes"): True,
    ("MPIDP_DEBUG", "On"): True, ("MPIDP_DEBUG", " 1\n"): True,
    ("MPIDP_TIMEOUT", ""): None, ("MPIDP_TIMEOUT", "  "): None, ("MPIDP_TIMEOUT", "2.5"): 2.5,
    ("MPIDP_TIMEOUT", " 60 "): 60.0, ("MPIDP_TIMEOUT", "1e-3"): 1e-3,
    ("MPIDP_COST", ""): None, ("MPIDP_COST", "default"): "default",
    ("MPIDP_COST", "2e-6,3e-10,4e-10"): (2e-6, 3e-10, 4e-10),
    ("MPIDP_COST", "1,2,3,4,5"): (1.0, 2.0, 3.0, 4.0, 5.0), ("MPIDP_COST", "0,0,0"): (0.0,) * 3,
    ("MPIDP_STAGING", ""): "auto", ("MPIDP_STAGING", "1"): "all", ("MPIDP_STAGING", "0"): "off",
    ("MPIDP_CUDA_AWARE", ""): None, ("MPIDP_CUDA_AWARE", "1"): True,
    ("MPIDP_CUDA_AWARE", "0"): False,
    ("MPIDP_FLIGHT", ""): None, ("MPIDP_FLIGHT", "0"): 0, ("MPIDP_FLIGHT", " 128 "): 128,
    ("MPIDP_FLIGHT_DIR", ""): None, ("MPIDP_FLIGHT_DIR", " d "): "d",
}
BAD = {  # variable -> texts it refuses, and what its error must say it takes
    "MPIDP_DEBUG": (["00", "2", "-1", "maybe", "enabled", "y", "0.0"],
                    "1, true, yes, on (on) or 0, false, no, off or empty (off)"),
    "MPIDP_TIMEOUT": (["nan", "inf", "-1", "0", "soon"], "a finite number of seconds > 0"),
    "MPIDP_COST": (["abc", "1,2", "1,2,3,4,5,6", "1,-2,3", "1,nan,3", "1,,3", "Default",
                    "inf,1,1", "1,1,1e309", "1,Infinity,1", "1,1,1,1,-inf", "1,1,1,inf"],
                   "'default' or alpha,beta,gamma[,fixed[,beta_inter]]"),
    "MPIDP_STAGING": (["2", "auto", "yes", "on"], "'1', '0', or unset"),
    "MPIDP_CUDA_AWARE": (["2", "yes", "true"], "'1', '0', or unset"),
    "MPIDP_FLIGHT": (["-1", "1.5", "many", "0x10"], "a whole number >= 0 (0: off)"),
}


@pytest.mark.parametrize("name, text", sorted(VALUES))
def test_every_documented_value_means_what_the_table_says(name, text, monkeypatch):
    monkeypatch.setenv(name, text)
    assert config.get(name) == VALUES[name, text]


def test_unset_is_the_default(monkeypatch):
    for name in config.VARIABLES:
        monkeypatch.delenv(name, raising=False)
        assert config.get(name) == config.parse(name, "")
    assert config.problems() == []


@pytest.mark.parametrize("name", sorted(BAD))
def test_any_other_value_is_an_error_naming_the_variable_and_its_values(name, monkeypatch):
    texts, takes = BAD[name]
    for text in texts:
        monkeypatch.setenv(name, text)
        with pytest.raises(config.ConfigError) as e:
            config.get(name)
        assert str(e.value).startswith(f"{name}={text!r}: expected {takes}"), e.value
        assert isinstance(e.value, ValueError)
        assert config.problems() == [str(e.value)]
        with pytest.raises(config.ConfigError, match=re.escape(name)):
            config.check()


def test_each_user_reads_its_variable_through_config(monkeypatch):
    """The places that act on a variable raise config's error, naming it (MPIDP_COST=abc
    used to say only "could not convert string to float")."""
    monkeypatch.setenv("MPIDP_COST", "abc")
    comm = MPI.COMM_SELF.Dup()
    try:
        with pytest.raises(ValueError, match=r"^MPIDP_COST='abc': expected 'default' or"):
            cost.model(comm)
        monkeypatch.setenv("MPIDP_COST", "1,2")  # too few numbers: was a TypeError from Model
        with pytest.raises(ValueError, match=r"^MPIDP_COST='1,2': expected"):
            cost.model(comm)
    finally:
        comm.Free()
    monkeypatch.setenv("MPIDP_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"^MPIDP_TIMEOUT='soon': expected a finite"):
        completion.timeout_from_env()
    with pytest.raises(ValueError, match=r"^MPIDP_CUDA_AWARE='yes': expected '1', '0'"):
        buffers._detect_cuda_aware("yes", None)


def test_set_debug_none_goes_back_to_the_environment(monkeypatch):
    """The fixture that turns the check off for a test turns it back to what the
    environment says, read through config (tests/conftest.py's no_debug_check)."""
    try:
        for text, on in (("off", False), ("yes", True)):
            monkeypatch.setenv("MPIDP_DEBUG", text)
            checks.set_debug(None)
            assert checks.debug_enabled() is on and checks.debug_enabled(True) is True
        checks.set_debug(False)
        assert checks.debug_enabled() is False
    finally:
        monkeypatch.undo()
        checks.set_debug(None)
    assert checks.debug_enabled() is config.get("MPIDP_DEBUG")


def test_no_module_but_config_reads_an_mpidp_variable():
    """One module reads them: a variable read anywhere else would escape the checks."""
    reads = re.compile(r"(environ|getenv)\b[^\n]*MPIDP_|MPIDP_\w*['\"]\s*\]?\s*(in|not in)\s+os")
    found = []
    for path in (ROOT / "mpidp").rglob("*.py"):
        if path.name != "config.py":
            found += [f"{path.relative_to(ROOT)}:{i}" for i, line in
                      enumerate(path.read_text().splitlines(), 1) if reads.search(line)]
    assert found == []
    named = set(re.findall(r"MPIDP_[A-Z_]+[A-Z]", "\n".join(
        p.read_text() for p in (ROOT / "mpidp").rglob("*.py"))))
    assert named <= set(config.VARIABLES), named - set(config.VARIABLES)


def test_the_docs_table_lists_every_variable():
    """docs/failures.md holds the one table; the README points at it."""
    text = (ROOT / "docs" / "failures.md").read_text()
    table = text[text.index("## Environment variables"):]
    rows = re.findall(r"^\| `(MPIDP_\w+)` \|", table, re.M)
    assert rows == list(config.VARIABLES), rows
    assert "docs/failures.md#environment-variables" in (ROOT / "README.md").read_text()


def _run(args: list[str], **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MPIDP_") and k != "PYTEST_ISOLATE_MPI_IS_FORKED"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env={**clean, **env}, cwd=ROOT)


def test_false_off_and_00_no_longer_turn_the_check_on():
    """Today's bug, in a fresh process (the variable is read once per process):
    MPIDP_DEBUG=false turned the agreement check on; 00 did too, silently."""
    code = "from mpidp.collectives import checks; print(checks.debug_enabled())"
    out = _run(["-c", code], MPIDP_DEBUG="false")
    assert (out.returncode, out.stdout.strip()) == (0, "False"), out.stderr
    out = _run(["-c", code], MPIDP_DEBUG="00")
    assert out.returncode == 1 and "ConfigError: MPIDP_DEBUG='00': expected" in out.stderr, \
        out.stderr


def test_the_launcher_says_every_bad_variable_in_one_line_and_exits_2(tmp_path):
    """python -m mpidp checks the environment before the program runs."""
    marker = tmp_path / "ran"
    out = _run(["-m", "mpidp", "-c", f"open({str(marker)!r}, 'w')"], MPIDP_DEBUG="00",
               MPIDP_COST="abc", MPIDP_STAGING="auto", MPIDP_TIMEOUT="60")
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpidp: error: MPIDP_DEBUG='00'"), lines
    for name in ("MPIDP_DEBUG", "MPIDP_COST", "MPIDP_STAGING"):
        assert f"{name}=" in lines[0] and BAD[name][1] in lines[0], lines
    assert not marker.exists() and out.stdout == ""


def test_across_ranks_one_line_on_rank_0_and_every_rank_exits_2(mpiexec):
    """Under mpiexec the same environment reaches every rank: all find the problem, rank
    0 alone says it, nobody waits for anybody (3 ranks: not a power of two)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("MPIDP_", "PMI_", "HYDRA_", "PYTEST_ISOLATE_MPI"))}
    out = subprocess.run([*mpiexec, "-n", "3", sys.executable, "-m", "mpidp", "-c", "print(1)"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**clean, "MPIDP_DEBUG": "maybe"})
    assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    # (Open MPI's launcher adds its own lines about a rank's exit code: not ours)
    ours = [line for line in out.stderr.splitlines() if line.startswith("mpidp")]
    assert ours == [f"mpidp: error: MPIDP_DEBUG='maybe': expected {BAD['MPIDP_DEBUG'][1]}"], \
        out.stderr
    assert "Traceback" not in out.stderr, out.stderr
