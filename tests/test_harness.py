"""The harness itself: a hung or crashing rank fails fast, with each rank's stack."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(__file__)


def _run_inner(tmp_path, body: str, timeout: float, flags=("-v",)) -> subprocess.CompletedProcess:
    """Run a one-test file through the real harness (pytest-isolate-mpi + conftest and the
    helpers it imports)."""
    test = tmp_path / "test_inner.py"
    test.write_text(textwrap.dedent(body))
    (tmp_path / "conftest.py").write_text(open(os.path.join(HERE, "conftest.py")).read())
    shutil.copytree(os.path.join(HERE, "helpers"), tmp_path / "helpers", dirs_exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ISOLATE_MPI_IS_FORKED"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *flags, "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env,
    )


def test_deadlock_fails_with_every_ranks_stack(tmp_path):
    body = """
        import pytest
        from mpi4py import MPI
        import numpy as np

        @pytest.mark.mpi(ranks=[3], timeout=8)
        def test_hang(mpi_ranks):
            comm = MPI.COMM_WORLD
            buf = np.empty(1)
            if comm.rank == 1:
                comm.Recv(buf, source=2, tag=99)   # nobody sends: rank 1 hangs
            comm.Barrier()                         # the others hang here
    """
    result = _run_inner(tmp_path, body, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "1 failed" in out, out
    # the report names the stuck ranks and shows where each one was
    assert "still running after" in out, out
    reported = {r for r in range(3) if f"=== rank {r} of 3" in out}
    assert len(reported) >= 2, f"expected every rank's report, got ranks {reported}:\n{out}"
    assert "test_inner.py" in out and ("Recv" in out or "Barrier" in out or "line" in out), out


def test_exception_on_one_rank_fails_without_hanging(tmp_path):
    body = """
        import pytest
        from mpi4py import MPI

        @pytest.mark.mpi(ranks=[4], timeout=30)
        def test_one_rank_raises(mpi_ranks):
            comm = MPI.COMM_WORLD
            if comm.rank == 2:
                raise RuntimeError("rank 2 fails on purpose")
            comm.Barrier()   # ranks 0, 1, 3 would wait forever for rank 2
    """
    result = _run_inner(tmp_path, body, timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "failed" in out, out
    assert "still running after" not in out, "the job should abort, not time out:\n" + out


@pytest.mark.mpi(ranks=[2], timeout=20)
def test_marked_tests_run_on_every_rank(mpi_ranks):
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_size() == mpi_ranks == 2


PASSING = """
    import pytest
    from mpi4py import MPI

    @pytest.mark.mpi(ranks=[2, 3], timeout=30)
    def test_sizes(mpi_ranks):
        assert MPI.COMM_WORLD.Get_size() == mpi_ranks

    def test_plain():
        assert MPI.COMM_WORLD.Get_size() == 1
"""


def test_quiet_runs_launched_tests(tmp_path):
    """``pytest -q``: the launched ranks run their test (pytest-isolate-mpi alone hands them
    a bare "-", "file or directory not found"). One report per rank and the plain test."""
    result = _run_inner(tmp_path, PASSING, timeout=90, flags=("-q",))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"^6 passed\b", out, re.M), out
    assert "not found" not in out, out


@pytest.mark.parametrize("flags", [("-v",), ()])
def test_progress_counts_every_ranks_report_and_ends_at_100_percent(tmp_path, flags):
    """Each rank's report is a line of its own (test[2][rank=1]); the progress counts them
    all, so it climbs to 100 % and no further."""
    result = _run_inner(tmp_path, PASSING, timeout=90, flags=flags)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    shown = [int(p) for p in re.findall(r"\[\s*(\d+)%\]", out)]
    assert shown and shown[-1] == 100 and max(shown) == 100, out
    if flags:
        assert len(re.findall(r"\[rank=\d\] PASSED", out)) == 5, out


def test_every_launch_goes_through_the_launch_helper():
    """No test spells an mpiexec of its own (which one, with which flags): they call
    tests/helpers/launch.py, which knows the MPI library (Open MPI's --oversubscribe). A
    command line that is only read, never run, says so: ``# not a launch``."""
    own = re.compile(r"""which\(\s*["']mpi(exec|run)["']|[\[(]\s*["']mpi(exec|run)["']\s*,""")
    found = []
    for folder in (HERE, os.path.join(HERE, "helpers")):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py") and name != "launch.py":
                with open(os.path.join(folder, name)) as f:
                    found += [f"{name}:{i}" for i, line in enumerate(f, 1)
                              if own.search(line) and "# not a launch" not in line]
    assert not found, f"launches of their own (use helpers.launch): {found}"


def test_the_launchers_notices_of_a_jobs_end_are_dropped_and_nothing_else(monkeypatch):
    from helpers import launch

    bar = "-" * 74 + "\n"
    notice = (bar + "prterun detected that one or more processes exited with non-zero status,\n"
              "thus causing the job to be terminated. The first process to do so was:\n\n"
              "   Process name: [prterun-vm-1@1,0]\n   Exit code:    2\n" + bar)
    other = bar + "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n" + bar
    err = "train_mlp.py: error: bad\n" + notice + other + "last\n"
    monkeypatch.setattr(launch, "OPEN_MPI", True)
    assert launch.program_output(err) == "train_mlp.py: error: bad\n" + other + "last\n"
    epoll = ("[warn] Epoll MOD(4) on fd 20 failed. Old events were 6; read change was 2 "
             "(del); write change was 0 (none); close change was 0 (none): Bad file "
             "descriptor\n")  # seen from prterun's event library under load
    assert launch.program_output("train_mlp.py: error: bad\n" + epoll + "[warn] mine\n") \
        == "train_mlp.py: error: bad\n[warn] mine\n"
    monkeypatch.setattr(launch, "OPEN_MPI", False)  # MPICH's Hydra adds none: left alone
    assert launch.program_output(err) == err
