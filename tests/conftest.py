"""Rank-safe test harness.

Tests marked ``@pytest.mark.mpi(ranks=[...], timeout=T)`` run as their own
``mpiexec -n N`` job (pytest-isolate-mpi): a crash or exception on one rank
aborts the job (mpi4py calls MPI_Abort on a non-zero exit), and a deadlock is
cut off. Inside every rank this file arms a watchdog a few seconds before the
job's timeout: it prints which rank was stuck, in which test, with every
thread's stack, then exits, so mpiexec tears down the other ranks and the test
fails with that report instead of hanging.

Every launch knows the MPI library through one helper, tests/helpers/launch.py: under
Open MPI (``make test MPI=openmpi``) the plugin's launches get its `FLAGS`
(``--oversubscribe``: more ranks than cores) and the two variables that let root run
it; tests that start mpiexec themselves call `helpers.launch` (or take the `mpiexec`
fixture, the start of its command line).

Two quirks of pytest-isolate-mpi 0.4.1 are mended here: with ``-q`` it hands the
launched ranks a bare ``-`` (they fail: "file or directory not found: -"), and each
rank's report counts as a test of its own in the progress, which then ran past 100 %.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import threading
import time

import pytest
from helpers import launch
from mpi4py import MPI

IN_RANK = bool(os.environ.get("PYTEST_ISOLATE_MPI_IS_FORKED"))
OPEN_MPI = launch.OPEN_MPI
MPIEXEC_FLAGS = launch.FLAGS  # what pytest-isolate-mpi's launches add after `mpiexec -n N`
if OPEN_MPI:  # the plugin's launches inherit this process's environment
    for _name, _value in launch.ROOT_VARS.items():
        os.environ.setdefault(_name, _value)

# Every collective of the suite checks that the ranks agree on its arguments (the
# launched ranks inherit it); tests that count bytes or messages turn it off with
# the `no_debug_check` fixture, since the check's own exchange would be counted.
os.environ.setdefault("MPIDP_DEBUG", "1")

# Flight records (mpidp.flight) that the suite's aborted jobs write go to a folder of the
# session's, not to ./mpidp-flight (the launched ranks inherit it; tests set their own).
if not IN_RANK and "MPIDP_FLIGHT_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["MPIDP_FLIGHT_DIR"] = tempfile.mkdtemp(prefix="mpidp-flight-")
    atexit.register(shutil.rmtree, os.environ["MPIDP_FLIGHT_DIR"], ignore_errors=True)

# The mpich wheel puts mpiexec beside the venv's python: find it even when the
# venv is not activated (`.venv/bin/python -m pytest`).
_bin = os.path.dirname(sys.executable)
if os.path.exists(os.path.join(_bin, "mpiexec")) and _bin not in os.environ["PATH"].split(":"):
    os.environ["PATH"] = _bin + os.pathsep + os.environ["PATH"]
MARGIN_S = 4.0  # report this long before the outer timeout kills mpiexec


def _age() -> float:
    """Seconds since this process started: the job's timeout runs from its launch, and
    starting a rank takes seconds (Open MPI's more than MPICH's, under load more still)."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, in clock ticks
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _timeout_of(item) -> float | None:
    mark = item.get_closest_marker("mpi")
    if mark is None or mark.kwargs.get("timeout") is None:
        return None
    scale = {"s": 1, "m": 60, "h": 3600}[mark.kwargs.get("unit", "s")]
    return float(mark.kwargs["timeout"]) * scale


def _quiet_safe(add_reporting_options):
    """pytest-isolate-mpi's reporting options for the launched ranks, right under ``-q``.

    It writes ``-`` + ``"v" * verbose``, and ``-q`` makes verbose negative: a bare ``-``,
    which the ranks take for a file to test. Here they get ``-q`` (as often as given)."""
    def add(cmd, option):
        quiet = max(0, -option.verbose)
        add_reporting_options(cmd, argparse.Namespace(**{**vars(option), "verbose":
                                                         max(0, option.verbose)}))
        cmd += ["-" + "q" * quiet] if quiet else []
    return add


@pytest.hookimpl(tryfirst=True)  # before pytest-isolate-mpi reads its ini options
def pytest_configure(config):
    if not IN_RANK:  # pytest-isolate-mpi puts mpi_command_line_args after `mpiexec -n N`
        args = config.getini("mpi_command_line_args")  # pyproject.toml declares it: a list
        if args is None:  # a folder without that setting (test_harness.py's inner runs)
            args = config._inicache["mpi_command_line_args"] = []
        args.extend(MPIEXEC_FLAGS)  # the cached list, which the plugin reads next
        from pytest_isolate_mpi import _subsession

        if not getattr(_subsession._add_reporting_options, "quiet_safe", False):
            _subsession._add_reporting_options = _quiet_safe(_subsession._add_reporting_options)
            _subsession._add_reporting_options.quiet_safe = True
        return
    # Every rank is its own pytest session; with the default base folder they
    # would prune each other's /tmp/pytest-of-USER/pytest-N folders.
    if not config.option.basetemp:
        import atexit
        import shutil
        import tempfile

        config.option.basetemp = tempfile.mkdtemp(prefix="mpidp-rank-")
        atexit.register(shutil.rmtree, config.option.basetemp, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """Count each launched rank's report in the progress: every rank of a job reports its
    own outcome (``test[3][rank=2]``), so a job of N ranks is N of the reports the progress
    counts, not one (else ``make test`` climbed to 123 %)."""
    if IN_RANK or session.config.getoption("--no-mpi-isolation", False):
        return
    session.testscollected += sum(_ranks_of(item) - 1 for item in session.items
                                  if item.get_closest_marker("mpi") is not None)


def _ranks_of(item) -> int:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("mpi_ranks", 1) if callspec is not None else 1


@pytest.fixture
def mpiexec() -> list[str]:
    """The start of an mpiexec command line (tests/helpers/launch.py): the venv's mpiexec
    and the MPI library's flags. Run it with ``launch.environ()`` where the job must not
    inherit this one's."""
    return [launch.mpiexec_path(), *launch.FLAGS]


if IN_RANK:
    _watchdogs: dict[str, threading.Timer] = {}

    def _report_and_exit(config, nodeid: str, seconds: float) -> None:
        capman = config.pluginmanager.getplugin("capturemanager")
        if capman is not None:  # give fd 2 back to the real stderr that mpiexec collects
            capman.suspend_global_capture(in_=True)
        comm = MPI.COMM_WORLD
        sys.stderr.write(
            f"\n=== rank {comm.Get_rank()} of {comm.Get_size()} (pid {os.getpid()}): "
            f"{nodeid} still running after {seconds:.0f} s; its threads:\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        time.sleep(1.0)  # let the other ranks' watchdogs report before mpiexec kills them
        os._exit(70)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(item):
        timeout = _timeout_of(item)
        if timeout is None:
            return
        seconds = max(1.0, timeout - MARGIN_S - _age())
        timer = threading.Timer(seconds, _report_and_exit, (item.config, item.nodeid, seconds))
        timer.daemon = True
        timer.start()
        _watchdogs[item.nodeid] = timer
        # backstop if the interpreter itself is wedged (no thread can take the GIL)
        faulthandler.dump_traceback_later(seconds + 1.5, exit=True)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(item):
        timer = _watchdogs.pop(item.nodeid, None)
        if timer is not None:
            timer.cancel()
            faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def no_debug_check():
    """Turn MPIDP_DEBUG's agreement check off for this test (its messages would be counted)."""
    from mpidp.collectives import checks

    checks.set_debug(False)
    yield
    checks.set_debug(None)  # back to what MPIDP_DEBUG says


@pytest.fixture
def shared_dir():
    """A fresh folder made by rank 0 and known to every rank of the job.

    Not pytest's tmp_path: each rank is its own pytest session, with its own.
    """
    import shutil
    import tempfile

    comm = MPI.COMM_WORLD
    folder = tempfile.mkdtemp(prefix="mpidp-test-") if comm.Get_rank() == 0 else None
    folder = comm.bcast(folder, root=0)
    yield folder
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Every multi-rank test must carry a timeout: refuse to run one without."""
    for item in items:
        mark = item.get_closest_marker("mpi")
        if mark is not None and mark.kwargs.get("timeout") is None:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mpi needs a timeout")
