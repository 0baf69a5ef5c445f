"""`python -m mpidp.sim` used wrongly: bad flags are usage errors (exit 2, one line naming the
flag), a broken schedule of your own is one message naming its rank and round (exit 1), and a
generator that never yields is stopped.

No MPI here: `main` runs in this process, except where the exit status itself is the point.
"""

import subprocess
import sys

import pytest

from mpidp.sim.__main__ import main


def usage_error(capsys, argv) -> str:
    """The one-line complaint of a command line that must be refused with exit 2."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, flag", [
    (["table", "ring", "--ranks", "0"], "--ranks"),
    (["table", "ring", "--ranks", "-2"], "--ranks"),
    (["draw", "ring", "--ranks", "0", "-o", "x.png"], "--ranks"),
    (["draw", "ring", "--ranks", "63", "-o", "x.png"], "--ranks"),  # one bit per rank
    (["table", "ring", "--count", "-1"], "--count"),
    (["draw", "ring", "--count", "-5", "-o", "x.png"], "--count"),
    (["table", "binomial", "--collective", "bcast", "--ranks", "4", "--root", "-1"], "--root"),
    (["table", "binomial", "--collective", "bcast", "--ranks", "4", "--root", "4"], "--root"),
    (["table", "ring", "--ranks", "4", "--ppn", "-1"], "--ppn"),
    (["volume", "--ranks", "4", "--hosts", "-2"], "--hosts"),
    (["volume", "--ranks", "2,4", "--hosts", "3"], "--hosts"),  # more hosts than ranks
    (["table", "ring", "--ranks", "4", "--placement", "0,1"], "--placement"),
    (["table", "ring", "--ranks", "4", "--placement", "0,-1,1,1"], "--placement"),
    (["check", "ring", "--ranks", "2-4", "--placement", "0,0,1"], "--placement"),
    (["predict", "--ranks", "4", "--ppn", "-4"], "--ppn"),
    (["predict", "--ranks", "4", "--bytes", "-8"], "--bytes"),
    (["table", "no_such_module:allreduce"], "no_such_module"),
    (["table", "mpidp.collectives.algorithms.ring:no_such_function"], "no_such_function"),
    (["check", "mpidp.collectives.algorithms.ring", "--ranks", "2"], "MODULE:FUNCTION"),
    # only generators of rounds are run: not any function a module has
    (["check", "os:getcwd", "--ranks", "2"], "'os:getcwd' is not a generator of rounds"),
    (["table", "os:getcwd"], "'os:getcwd' is not a generator of rounds"),
    (["check", "mpidp.collectives.algorithms.ring:ring_allreduce_cost", "--ranks", "2"],
     "is not a generator of rounds"),
    (["check", "mpidp.collectives.algorithms.ring:Blocks", "--ranks", "2"],
     "is not a generator of rounds"),
    (["check", "ring", "--ranks", "2", "--scratch", "os:getcwd"],
     "'os:getcwd' is not a Python function"),
])
def test_bad_flags_are_usage_errors(capsys, argv, flag):
    assert flag in usage_error(capsys, argv)


def test_a_root_in_range_and_a_placement_of_the_right_length_still_run(capsys):
    assert main(["table", "binomial", "--collective", "bcast", "--ranks", "4", "--root",
                 "3"]) == 0
    assert "rank 3" in capsys.readouterr().out
    assert main(["table", "ring", "--ranks", "4", "--placement", "0,0,1,1"]) == 0
    assert main(["table", "ring", "--ranks", "1", "--count", "0"]) == 0


BAD = '''\
import numpy as np
from mpidp.collectives.algorithms.rounds import Recv, Send


def unlisted(comm, buf, blocks, op, tmp, src=None):
    """Yields a Send itself, not a list of them, in its second round."""
    peer = 1 - comm.Get_rank()
    yield [Send(buf, peer), Recv(tmp[: buf.size], peer)]
    yield Send(buf, peer)


def listless(comm, buf, blocks, op, tmp, src=None):
    """Sends a Python list, which no MPI call takes, to a rank that has already finished."""
    if comm.Get_rank() == 0:
        yield [Send(buf.tolist(), 1)]


def spins(comm, buf, blocks, op, tmp, src=None):
    """Rank 1 loops for ever before its first round, without yielding."""
    while comm.Get_rank() == 1:
        pass
    yield []
'''


def run_cli(tmp_path, *args, timeout=120):
    (tmp_path / "bad.py").write_text(BAD)
    return subprocess.run([sys.executable, "-m", "mpidp.sim", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=timeout)


@pytest.mark.parametrize("function, says", [
    ("unlisted", "rank 0, round 1: a round is a list of Send and Recv, got Send("),
    ("listless", "rank 0, round 0: the Send's buffer is a list, not a NumPy array"),
])
def test_a_broken_generator_is_one_message_naming_its_rank_and_round(tmp_path, function, says):
    done = run_cli(tmp_path, "table", f"bad:{function}", "--ranks", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr, done.stderr
    assert "deadlock" not in done.stderr


def test_a_generator_that_never_yields_is_stopped(tmp_path):
    done = run_cli(tmp_path, "table", "bad:spins", "--ranks", "3", "--timeout", "1", timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert ("rank 1, before its first round: the algorithm ran for more than 1 s without "
            "yielding") in done.stderr, done.stderr


def test_the_check_command_reports_a_generator_that_never_yields(tmp_path):
    done = run_cli(tmp_path, "check", "bad:spins", "--ranks", "2", "--quick", "--timeout",
                   "0.5", timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED" in done.stdout and "without yielding" in done.stdout, done.stdout


def test_timeout_must_be_positive(capsys):
    assert "--timeout" in usage_error(capsys, ["table", "ring", "--timeout", "0"])


def test_a_module_that_fails_to_import_is_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    done = subprocess.run([sys.executable, "-m", "mpidp.sim", "check", "broken:f", "--ranks",
                           "2"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "cannot load 'broken:f'" in done.stderr
    assert "boom" in done.stderr.strip().splitlines()[-1]
