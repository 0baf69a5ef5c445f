"""``python -m mpidp``: run a program so that an exception on any rank ends the whole job.

    mpiexec -n 4 python -m mpidp train.py --epochs 3      # a script and its arguments
    mpiexec -n 4 python -m mpidp -m package.module args   # a module, as python -m does
    mpiexec -n 4 python -m mpidp -c "code"                # a command

Run plainly (``python train.py``), a rank whose program raises leaves Python
and waits in ``MPI_Finalize`` for peers that wait for it in their next
collective: the job hangs. Run through this, the rank prints its traceback and
one line, ``mpidp: rank 1 of 4: train.py failed: ValueError: ...; aborting the
job``, and calls ``MPI_Abort``, which ends every rank; mpiexec exits non-zero
(the code of ``sys.exit(n)``, 124 for a `TimeoutError`, else 1). This is what
``python -m mpi4py`` does; its runner (runpy) runs the program here too.
``import mpidp`` initializes MPI before the program starts, so the program's own
``mpi4py.rc`` settings come too late: use ``python -m mpi4py -rc ...`` for those.

The ``MPIDP_*`` environment variables are checked first (`mpidp.config`): a value
a variable does not take is one line on rank 0, ``mpidp: error: MPIDP_DEBUG='00':
expected ...`` (every bad variable, in that line), and exit code 2 on every rank,
before the program starts. mpiexec gives every rank the same environment, so all
ranks find the same problem and none waits for another.
"""

from __future__ import annotations

import sys

from mpi4py import MPI
from mpi4py.run import run_command_line

from . import config, watchdog

USAGE = """usage: python -m mpidp <script.py> [arg] ...
   or: python -m mpidp -m <module> [arg] ...
   or: python -m mpidp -c <command> [arg] ...
Runs the program; if it raises on any rank, every rank of the job ends (MPI_Abort)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2) or (
            argv[0].startswith("-") and argv[0] not in ("-m", "-c", "-")):
        print(USAGE, file=sys.stderr)
        return 2
    found = config.problems()
    if found:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"mpidp: error: {'; '.join(found)}", file=sys.stderr, flush=True)
        return 2
    what = argv[1] if argv[0] == "-m" else "-c program" if argv[0] == "-c" else argv[0]
    return watchdog.run(lambda: run_command_line(argv), what, farewell=True)


if __name__ == "__main__":
    sys.exit(main())
