"""Failure behaviour: a job finishes, or ends on every rank in bounded time with one clear line.

Most tests here launch ``mpiexec`` themselves, since what is tested is how the
job ends: every launch has a timeout, after which its whole process group is
killed, so a hang fails the test instead of hanging the suite. Faults are
injected into one rank with ``python -c`` (patch a function on that rank, then
run the entry point with runpy, as ``python -m`` or ``python file.py`` would).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import launch

from mpidp import watchdog

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(ROOT, "examples", "train_mlp.py")
HANG_S = 90  # a launch that has not ended by then hangs: the test fails
SMALL = ["--epochs", "1", "--global-batch", "960", "--hidden", "8", "--progress", "never",
         "--data", "synthetic"]  # no scikit-learn to import: start-up in ~1 s, not 5-10


def mpiexec(n: int, argv: list[str], env: dict | None = None, timeout: float = HANG_S):
    """Run `argv` as `n` ranks; (exit code or None if it hung, stdout, stderr, seconds).
    The launch is tests/helpers/launch.py's: the MPI library's flags, a clean environment."""
    return launch.run(n, argv, env=env, timeout=timeout, cwd=ROOT)


def inject(fault: str, run: str) -> list[str]:
    """``python -c``: apply `fault` (code that sees `rank`), then `run` the entry point."""
    code = textwrap.dedent("""
        import runpy, sys, time
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
        def boom(*args, **kwargs):
            raise RuntimeError(f"injected fault on rank {rank}")
        def stall(*args, **kwargs):
            print(f"stalled on rank {rank}", flush=True)
            time.sleep(3600)
    """) + textwrap.dedent(fault) + "\n" + textwrap.dedent(run)
    return [sys.executable, "-c", code]


def report(code, out, err, seconds) -> str:
    return f"exit {code} after {seconds:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}"


# ---------------------------------------------------------------- python -m mpidp


SCRIPTS = {  # what rank 1 (or every rank) does wrong -> exit code (None: not 0), message
    "raises": ("""
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 1:
            raise ValueError("bad input on rank 1")
        MPI.COMM_WORLD.Barrier()
    """, 1, "script.py failed: ValueError: bad input on rank 1"),
    "bad buffer on one rank": ("""
        import numpy as np, mpidp
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        x = np.ones(2000)
        send = x[::2] if comm.rank == 1 else x[:1000]  # rank 1's is not contiguous
        mpidp.allreduce(comm, send, np.empty(1000))  # the others wait for rank 1 in it
    """, 1, "script.py failed: ValueError: sendbuf must be C-contiguous"),
    "raises mid-collective": ("""
        import numpy as np, mpidp
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        x = np.ones(1 << 16)
        h = mpidp.iallreduce(comm, mpidp.IN_PLACE, x, algorithm="ring")
        h.test()
        if comm.rank == comm.size - 1:
            raise RuntimeError("gave up mid-collective")
        h.wait()
    """, 1, "script.py failed: RuntimeError: gave up mid-collective"),
    "unprintable exception": ("""
        from mpi4py import MPI
        class Unprintable(Exception):
            def __str__(self):
                raise RuntimeError("no text for this exception")
        if MPI.COMM_WORLD.rank == 1:
            raise Unprintable()
        MPI.COMM_WORLD.Barrier()
    """, 1, "script.py failed: Unprintable: <exception: str() failed>"),
    "stderr closed": ("""
        import sys
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 2:
            sys.stderr.close()  # nothing can be printed: the traceback raises ValueError
            raise RuntimeError("unseen")
        MPI.COMM_WORLD.Barrier()
    """, 1, None),
    "stderr blocks": ("""
        import sys, time
        from mpi4py import MPI
        class Stuck:
            def write(self, text):
                time.sleep(3600)  # the traceback is never printed
            def flush(self):
                pass
        if MPI.COMM_WORLD.rank == 1:
            sys.stderr = Stuck()
            raise RuntimeError("unseen")
        MPI.COMM_WORLD.Barrier()
    """, None, None),  # the rank exits 1 at its timer, mpiexec kills the others: their code
    "unprintable exit": ("""
        import sys
        from mpi4py import MPI
        class Unprintable:
            def __str__(self):
                raise KeyboardInterrupt  # not even an Exception
        if MPI.COMM_WORLD.rank == 0:
            sys.exit(Unprintable())
        MPI.COMM_WORLD.Barrier()
    """, 1, "script.py exited: <Unprintable object: str() failed>"),
    "exits 3": ("""
        import sys
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            sys.exit(3)
        MPI.COMM_WORLD.Barrier()
    """, 3, "script.py exited with status 3"),
    # an exit status is taken mod 256: 256 and 512 would end the aborted job with 0
    "exits 256": ("""
        import sys
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 1:
            sys.exit(256)
        MPI.COMM_WORLD.Barrier()
    """, 1, "script.py exited with status 256"),
    "exits 512": ("""
        import sys
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            sys.exit(512)
        MPI.COMM_WORLD.Barrier()
    """, 1, "script.py exited with status 512"),
}


def test_ranks_that_disagree_end_at_mpidp_timeout_under_the_launcher(tmp_path):
    """Counts differ (no debug check): the signatures keep the ranks apart, the collective
    stalls, and MPIDP_TIMEOUT bounds the blocking call: TimeoutError, exit 124."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, mpidp
        from mpi4py import MPI
        n = 10 + MPI.COMM_WORLD.rank % 2  # the odd ranks pass one item more
        mpidp.allreduce(MPI.COMM_WORLD, np.ones(n), np.empty(n))
    """))
    env = {**os.environ, "MPIDP_TIMEOUT": "3", "MPIDP_DEBUG": "0"}
    code, out, err, seconds = mpiexec(3, [sys.executable, "-m", "mpidp", str(script)], env)
    assert code == watchdog.EXIT_TIMEOUT, report(code, out, err, seconds)
    assert "TimeoutError" in err and "disagree" in err, report(code, out, err, seconds)
    assert seconds < 30, report(code, out, err, seconds)


@pytest.mark.parametrize("case, n", [("raises", 2), ("bad buffer on one rank", 3),
                                     ("raises mid-collective", 4), ("exits 3", 3),
                                     ("unprintable exception", 2),
                                     ("stderr closed", 3), ("stderr blocks", 3),
                                     ("unprintable exit", 3), ("exits 256", 2),
                                     ("exits 512", 2)])
def test_the_launcher_ends_the_job_when_one_rank_fails(tmp_path, case, n):
    body, exit_code, message = SCRIPTS[case]
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    code, out, err, seconds = mpiexec(n, [sys.executable, "-m", "mpidp", str(script)])
    assert code is not None, "the job hung\n" + report(code, out, err, seconds)
    assert code == exit_code or (exit_code is None and code != 0), \
        report(code, out, err, seconds)
    if message is not None:  # None: the rank cannot print it
        assert message in err and "aborting the job" in err, report(code, out, err, seconds)
    assert seconds < 60, report(code, out, err, seconds)


LEAVES = {  # how the others wait for the rank that has left -> ranks, the one that leaves
    "mpidp.allreduce under MPIDP_TIMEOUT": (4, 1, """
        mpidp.allreduce(comm, np.ones(1000), np.empty(1000), algorithm="ring")
    """),
    "a native Barrier under watchdog.guard": (3, 0, """
        with watchdog.guard(what="the barrier"):  # MPIDP_TIMEOUT's deadline
            comm.Barrier()
    """),
}


@pytest.mark.parametrize("case", sorted(LEAVES))
def test_a_rank_that_ends_while_the_others_wait_is_named_at_the_deadline(tmp_path, case):
    """A rank whose program ends with status 0 takes part in no more collectives: the
    others, waiting for it, end at MPIDP_TIMEOUT, and their line names the rank that left
    (the ones they wait for may be others: in a ring, each waits for its left neighbour)."""
    n, leaver, wait = LEAVES[case]
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np, mpidp
        from mpi4py import MPI
        from mpidp import watchdog
        comm = MPI.COMM_WORLD
        if comm.rank == LEAVER:
            print("done early", flush=True)
            sys.exit(0)
    """).replace("LEAVER", str(leaver)) + textwrap.dedent(wait))
    env = {**os.environ, "MPIDP_TIMEOUT": "3", "MPIDP_DEBUG": "0"}
    code, out, err, seconds = mpiexec(n, [sys.executable, "-m", "mpidp", str(script)], env)
    assert code == watchdog.EXIT_TIMEOUT, report(code, out, err, seconds)
    lines = [line for line in err.splitlines() if line.startswith("mpidp: rank ")]
    assert lines, report(code, out, err, seconds)
    for line in lines:
        assert f"rank {leaver} of {n}: " not in line, line  # the one that left said nothing
        assert f"rank {leaver} had already left (its program ended with status 0)" in line, \
            report(code, out, err, seconds)
    assert seconds < 30, report(code, out, err, seconds)


def test_ranks_that_all_end_cleanly_exit_0_and_say_nothing(tmp_path):
    """Ranks that end at different times (returning, sys.exit(0), sys.exit(), calling
    MPI.Finalize first) say goodbye and wait for each other's: every one exits 0, and
    nothing is printed. (Rank 3 says it from inside MPI_Finalize, as the others wait.)"""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.rank
        time.sleep(0.3 * (rank % 4))  # they end one after the other, rank 4 with rank 0
        if rank == 1:
            sys.exit(0)
        if rank == 2:
            sys.exit()
        if rank == 3:
            MPI.Finalize()
        print(f"rank {rank} ends", flush=True)
    """))
    code, out, err, seconds = mpiexec(5, [sys.executable, "-m", "mpidp", str(script)])
    assert code == 0 and err == "", report(code, out, err, seconds)
    # Ranks 0 and 4 print at the same moment, and mpiexec may join their lines into one.
    assert sorted(re.findall(r"rank \d+ ends", out)) == [f"rank {r} ends" for r in (0, 3, 4)], \
        report(code, out, err, seconds)


def test_ctrl_c_ends_a_rank_that_waits_for_the_others_at_its_end(tmp_path):
    """Rank 0 has ended and waits for rank 1's goodbye; Ctrl-C on mpiexec ends both."""
    script = tmp_path / "script.py"
    script.write_text("import time\nfrom mpi4py import MPI\n"
                      "if MPI.COMM_WORLD.rank == 1:\n    print('busy', flush=True)\n"
                      "    time.sleep(60)\n")
    proc = subprocess.Popen(launch.command(2, [sys.executable, "-m", "mpidp", str(script)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=launch.environ(), start_new_session=True)
    try:
        assert proc.stdout.readline() == "busy\n"
        time.sleep(1.0)  # rank 0 is past its program: waiting for the goodbyes
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # it hung: mpiexec and every rank it started
            os.killpg(proc.pid, signal.SIGKILL)
    if launch.OPEN_MPI:  # its mpiexec forwards no SIGINT (nor can it): it ends the ranks
        assert proc.returncode != 0, (out, err)
    else:
        assert proc.returncode == 130, (out, err)
        assert "mpidp: rank 0 of 2: " in err and "interrupted; aborting the job" in err, err
    assert time.monotonic() - t0 < 10


def test_the_launcher_runs_a_script_or_a_module_as_python_would(tmp_path):
    program = ("import sys\nfrom mpi4py import MPI\n"
               "with open(f'{sys.argv[1]}/rank{MPI.COMM_WORLD.rank}', 'w') as f:\n"
               "    f.write(repr([__name__, *sys.argv[2:]]))\n")
    (tmp_path / "prog.py").write_text(program)
    for name, how in (("script", [str(tmp_path / "prog.py")]), ("module", ["-m", "prog"])):
        out = tmp_path / name
        out.mkdir()
        code, stdout, err, seconds = mpiexec(2, [sys.executable, "-m", "mpidp", *how, str(out),
                                                 "a", "-b"], env={"PYTHONPATH": str(tmp_path)})
        assert code == 0, report(code, stdout, err, seconds)
        for rank in (0, 1):
            assert (out / f"rank{rank}").read_text() == "['__main__', 'a', '-b']", how
    usage = subprocess.run([sys.executable, "-m", "mpidp"], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 2 and "usage: python -m mpidp" in usage.stderr


# ---------------------------------------------------------------- the shipped entry points


ENTRY_POINTS = {  # entry point -> (fault on rank 1, how it is run)
    "train_mlp.py": ("""
        if rank == 1:  # the others wait for it in the first broadcast
            from mpidp.training import ddp
            ddp.DataParallel.__init__ = boom
    """, f"""
        sys.argv = [{TRAIN!r}, *{SMALL!r}]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """),
    "dropin.py": ("""
        import mpidp
        if rank == 1:
            mpidp.Comm = boom  # after the native half has run
    """, """
        sys.argv = ["examples/dropin.py"]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """),
    "ring_walkthrough.py": ("""
        import mpidp.collectives.engine.driver as schedule
        if rank == 1:
            schedule.exchange = boom
    """, """
        sys.argv = ["examples/ring_walkthrough.py"]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """),
    "python -m mpidp.bench": ("""
        import mpidp.bench.collectives as bench
        if rank == 1:
            bench.sweep = boom
    """, """
        sys.argv = ["mpidp.bench", "collectives", "--max", "64", "--iters", "1"]
        runpy.run_module("mpidp.bench", run_name="__main__", alter_sys=True)
    """),
    "python -m mpidp.cluster": ("""
        import mpidp.collectives.api as api
        if rank == 1:
            api.allreduce = boom
    """, """
        sys.argv = ["mpidp.cluster", "bench-rank", "0.01", "1", "none"]
        runpy.run_module("mpidp.cluster", run_name="__main__", alter_sys=True)
    """),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_ends_the_job_when_one_rank_raises(entry):
    fault, run = ENTRY_POINTS[entry]
    code, out, err, seconds = mpiexec(2, inject(fault, run))
    assert code is not None, "the job hung\n" + report(code, out, err, seconds)
    assert code == 1, report(code, out, err, seconds)
    assert "mpidp: rank 1 of 2: " in err and "RuntimeError: injected fault on rank 1" in err, \
        report(code, out, err, seconds)


def test_every_example_ends_the_job_on_an_exception():
    """gpu_check.py needs a GPU to get past its first line: at least check it is wired."""
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        if name.endswith(".py"):
            text = open(os.path.join(ROOT, "examples", name)).read()
            assert "sys.exit(watchdog.run(main" in text.split('if __name__ == "__main__":')[1], \
                name


# ---------------------------------------------------------------- the trainer's flags


def trainer():
    spec = importlib.util.spec_from_file_location("train_mlp", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BAD_FLAGS = {  # flags -> what the one line says
    "--epochs -1": "argument --epochs: must be >= 1, got -1",
    "--epochs 0": "argument --epochs: must be >= 1, got 0",
    "--global-batch 0": "argument --global-batch: must be >= 1, got 0",
    "--global-batch -64": "argument --global-batch: must be >= 1, got -64",
    "--accum-steps 0": "argument --accum-steps: must be >= 1, got 0",
    "--global-batch 255 --accum-steps 2": "not a multiple of ranks x accum steps = 1 x 2",
    "--global-batch 100000": "exceeds the",
    "--lr 0": "argument --lr: must be > 0",
    "--lr nan": "argument --lr: must be > 0",
    "--hidden 128,x": "argument --hidden: expected numbers such as 128,64, got '128,x'",
    "--hidden 0": "argument --hidden: every number must be >= 1",
    "--bucket-mb -1": "argument --bucket-mb: must be >= 0",
    "--resume": "--resume needs --checkpoint FILE",
    "--epochs two": "argument --epochs: invalid int value: 'two'",
}


def exit_code_of_main(argv: list[str]) -> int:
    """main()'s return value, or the code of the SystemExit every rank raises."""
    try:
        return trainer().main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("flags, n", [("--epochs -1", 2), ("--trace {d}/x --metrics {d}/x", 3)])
def test_a_bad_trainer_flag_is_one_line_under_the_launcher_too(flags, n, tmp_path):
    """Before: a flag argparse refused (every rank returns 2) ended in an abort under
    python -m mpidp, with a line per rank and MPI_Abort's own."""
    argv = [sys.executable, "-m", "mpidp", TRAIN, *SMALL, *flags.format(d=tmp_path).split()]
    code, out, err, seconds = mpiexec(n, argv)
    assert code == 2, report(code, out, err, seconds)
    assert err.startswith("train_mlp.py: error: ") and len(err.splitlines()) == 1, \
        report(code, out, err, seconds)
    assert out == ""


@pytest.mark.parametrize("flags", sorted(BAD_FLAGS))
def test_bad_flags_are_one_line_and_exit_code_2_before_any_work(flags, capsys, tmp_path):
    metrics = tmp_path / "m.jsonl"
    code = exit_code_of_main([*flags.split(), "--metrics", str(metrics), "--progress", "never",
                              "--data", "synthetic"])
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert err.startswith("train_mlp.py: error: ") and len(err.splitlines()) == 1, err
    assert BAD_FLAGS[flags] in err, err
    assert out == "" and not metrics.exists()  # nothing trained, nothing written


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_a_bad_mpidp_timeout_is_a_clear_error(value, monkeypatch, capsys):
    with pytest.raises(ValueError, match=rf"MPIDP_TIMEOUT='{value}': expected a finite number"):
        monkeypatch.setenv("MPIDP_TIMEOUT", value)
        watchdog.timeout_from_env()
    assert trainer().main([*SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_mlp.py: error: MPIDP_TIMEOUT=") and len(err.splitlines()) == 1
    for bad in (math.nan, math.inf, -1.0, 0):
        with pytest.raises(ValueError, match="finite number of seconds > 0"):
            with watchdog.guard(bad):
                pass
        with pytest.raises(ValueError, match="finite number of seconds > 0"):
            watchdog.wait(None, bad)
    monkeypatch.setenv("MPIDP_TIMEOUT", " 2.5 ")
    assert watchdog.timeout_from_env() == 2.5


@pytest.mark.parametrize("name, value", [("MPIDP_DEBUG", "maybe"), ("MPIDP_COST", "abc"),
                                         ("MPIDP_STAGING", "2")])
def test_any_bad_mpidp_variable_is_a_usage_error_of_the_trainer(name, value, monkeypatch,
                                                               capsys, tmp_path):
    """Not only MPIDP_TIMEOUT: every variable config reads (MPIDP_DEBUG=maybe used to
    turn the check on; MPIDP_COST=abc failed after start-up, not naming the variable)."""
    monkeypatch.setenv(name, value)
    metrics = tmp_path / "m.jsonl"
    assert trainer().main([*SMALL, "--metrics", str(metrics)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"train_mlp.py: error: {name}={value!r}: expected ") and \
        len(err.splitlines()) == 1, err
    assert not metrics.exists()


@pytest.mark.parametrize("flag, n", [("--metrics", 2), ("--trace", 3), ("--checkpoint", 4)])
def test_an_unwritable_output_path_ends_every_rank_at_once(tmp_path, flag, n):
    """The issue's hang: rank 0 failed to open --metrics outside any deadline."""
    path = str(tmp_path / "nodir" / "out")
    code, out, err, seconds = mpiexec(n, [sys.executable, TRAIN, *SMALL, flag, path])
    assert code == 2, report(code, out, err, seconds)
    assert err.strip() == f"train_mlp.py: error: {flag} {path}: there is no folder " \
                          f"{os.path.dirname(path)}", report(code, out, err, seconds)
    assert "epoch" not in out  # before any training


def test_an_existing_checkpoint_is_refused_on_every_rank(tmp_path):
    ck = tmp_path / "ck.npz"
    ck.write_bytes(b"three epochs of work")
    code, out, err, seconds = mpiexec(3, [sys.executable, TRAIN, *SMALL, "--checkpoint", str(ck)])
    assert code == 2, report(code, out, err, seconds)
    assert err.strip() == (f"train_mlp.py: error: --checkpoint {ck} exists: pass --resume to "
                           "continue from it, or --overwrite to replace it"), err
    assert ck.read_bytes() == b"three epochs of work"


# ---------------------------------------------------------------- the default deadline


STALLS = {  # where one rank stalls -> the fault
    "initial broadcast": "from mpidp.training import ddp; ddp.DataParallel.__init__ = stall",
    "a step": "from mpidp.training import optim; optim.SGD.step = stall",
    "checkpoint write": "from mpidp.training import checkpoint; checkpoint.save = stall",
    "trace gather": "from mpidp import trace; trace.Tracer.write = stall",
    "close": "from mpidp.training import ddp; ddp.DataParallel.close = stall",
}


def _stalled_run(where: str, folder) -> tuple:
    """Train on 2 ranks, one of them stuck at `where`, no MPIDP_TIMEOUT: what `mpiexec`
    returns. The start-up deadline (the default floor) is made 10 s where the stall is the
    start-up's (the initial broadcast), 20 s elsewhere, where the 3 s after it are tested:
    the five jobs start together on 2 cores (`stalled_runs`), so start-up is slower."""
    staller = 0 if where == "checkpoint write" else 1  # rank 0 writes the checkpoints
    fault = f"""
        from mpidp import watchdog
        watchdog.DEFAULT_FLOOR_S = {10.0 if where == "initial broadcast" else 20.0}
        kick = watchdog.Dog.kick
        def kick_with_a_short_floor(self):
            self.floor = 3.0  # after start-up: the test's own
            kick(self)
        watchdog.Dog.kick = kick_with_a_short_floor
        if rank == {staller}:
            {STALLS[where]}
    """
    flags = [*SMALL, "--checkpoint", str(folder / "ck.npz"), "--trace",
             str(folder / "trace.json")]
    run = f"""
        sys.argv = [{TRAIN!r}, *{flags!r}]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """
    return staller, mpiexec(2, inject(fault, run), env={"MPIDP_TIMEOUT": ""}, timeout=60)


@pytest.fixture(scope="module")
def stalled_runs(tmp_path_factory):
    """Every STALLS job launched at once (each waits seconds for its deadline, mostly
    asleep): where -> (the stalled rank, mpiexec's result)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(STALLS)) as pool:
        futures = {where: pool.submit(_stalled_run, where, tmp_path_factory.mktemp("stall"))
                   for where in STALLS}
        return {where: future.result() for where, future in futures.items()}


@pytest.mark.parametrize("where", sorted(STALLS))
def test_the_trainer_has_a_default_deadline_for_everything_collective(where, stalled_runs):
    """No MPIDP_TIMEOUT: a rank stuck anywhere ends the job, by the default deadline
    (its floor made 10 s for a stalled start-up and 3 s after it here, so that the test is
    quick; the five jobs run at once, `stalled_runs`)."""
    staller, (code, out, err, seconds) = stalled_runs[where]
    assert code == watchdog.EXIT_TIMEOUT, report(code, out, err, seconds)
    assert f"stalled on rank {staller}" in out, report(code, out, err, seconds)
    floor = 10 if where == "initial broadcast" else 3
    assert f"training made no progress for {floor} s (the default deadline" in err, \
        report(code, out, err, seconds)


def test_the_default_deadline_grows_with_the_longest_stretch_between_kicks(monkeypatch):
    monkeypatch.setattr(watchdog, "abort", lambda *a, **k: pytest.fail("aborted"))
    dog = watchdog.Dog("auto", "test", None, floor=0.5, factor=2)
    try:
        assert dog.timeout == 0.5
        time.sleep(0.4)
        dog.kick()
        assert dog.timeout == 0.5  # the first stretch (start-up) is the floor's alone
        time.sleep(0.1)
        dog.kick()
        assert dog.timeout == 0.5  # 2 x 0.1 s is under the floor
        time.sleep(0.4)
        dog.kick()
        assert 0.8 <= dog.timeout < 1.5  # 2 x the longest stretch
        dog.kick()
        assert 0.8 <= dog.timeout < 1.5  # a short stretch does not shrink it
    finally:
        dog.stop()
    assert watchdog.DEFAULT_FLOOR_S == 60 and watchdog.DEFAULT_FACTOR == 10  # as documented


def test_the_watchdog_fires_within_a_second_of_the_deadline_after_the_last_kick(monkeypatch):
    """Start-up may last 30 s, each stretch after it 1.5 s: kicked for 1.6 s, then left, the
    dog must fire 1.5 s after the last kick (+ 1 s), not when a check once per start-up
    deadline, or once per stretch (3 s, 4.5 s, ...), would next look."""
    fired = threading.Event()
    when = []

    def abort(message, code, comm=None):  # record instead of ending this process
        when.append(time.monotonic())
        dog.stop()
        fired.set()

    monkeypatch.setattr(watchdog, "abort", abort)
    dog = watchdog.Dog(1.5, "test", None, startup=30.0)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.6:  # past the first 1.5 s stretch by a little
        dog.kick()
        last = time.monotonic()
        time.sleep(0.1)
    try:
        fired.wait(1.5 + 1.0 + 1.0)  # a second past the bound: the bound is what is asserted
    finally:
        dog.stop()
    assert when, "the watchdog did not fire within 1.5 s + 1 s of the last kick"
    assert 1.5 <= when[0] - last <= 1.5 + 1.0, f"fired {when[0] - last:.2f} s after the last kick"


def test_mpidp_timeout_replaces_the_default_after_start_up(monkeypatch):
    monkeypatch.setattr(watchdog, "abort", lambda *a, **k: pytest.fail("aborted"))
    monkeypatch.setenv("MPIDP_TIMEOUT", "5")
    with watchdog.guard("auto", "test") as dog:
        assert dog.allowed == watchdog.DEFAULT_FLOOR_S  # start-up: one-off work, the floor
        dog.kick()
        assert dog.allowed == 5.0  # each stretch after it: MPIDP_TIMEOUT's, fixed
    monkeypatch.setenv("MPIDP_TIMEOUT", "600")
    with watchdog.guard("auto", "test") as dog:
        assert dog.allowed == 600.0
    with watchdog.guard(7, "test") as dog:  # a number: every stretch, start-up included
        assert dog.allowed == 7.0



def test_the_placement_query_of_the_first_auto_call_has_the_deadline_too(tmp_path):
    """The first `auto` call learns the placement by MPI's Split_type, a blocking call that
    MPIDP_TIMEOUT did not bound: a rank that never came left the others in it for good.
    Now it ends at the deadline (exit 124), with one line and a flight record naming it."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import time
        import numpy as np, mpidp
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 1:
            time.sleep(40)  # comes long after the deadline
        mpidp.allreduce(MPI.COMM_WORLD, MPI.IN_PLACE, np.ones(8))
    """))
    folder = tmp_path / "flight"
    env = {**os.environ, "MPIDP_TIMEOUT": "3", "MPIDP_COST": "", "MPIDP_DEBUG": "0",
           "MPIDP_FLIGHT_DIR": str(folder)}
    code, out, err, seconds = mpiexec(2, [sys.executable, str(script)], env)
    assert code == watchdog.EXIT_TIMEOUT, report(code, out, err, seconds)
    assert "rank 0 of 2: the placement query (Split_type) of the first call that reads it " \
           "made no progress for 3 s (MPIDP_TIMEOUT)" in err, report(code, out, err, seconds)
    assert seconds < 30, report(code, out, err, seconds)
    record = json.loads((folder / "flight-rank-0.json").read_text())
    calls = [k for c in record["comms"] for k in c["calls"]]
    assert any(k.get("collective") == "placement query (Split_type)" and
               k["state"] == "started" for k in calls), calls
