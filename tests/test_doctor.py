"""Hung jobs, dumped and diagnosed: each scenario runs under mpiexec and ``python -m
mpidp`` with a short deadline (MPIDP_TIMEOUT), every rank writes its flight record
(mpidp.flight), and ``python -m mpidp.doctor`` must name the rank(s), the collective's
number, the call site (the line marked ``# <site>`` in the script) and the cause.

The scenarios run as concurrent jobs, launched once for the module (each waits
seconds for its deadline: serially they would add a minute).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import launch
from helpers.launch import OPEN_MPI

PRELUDE = """\
import os, sys, time
import numpy as np
from mpi4py import MPI
import mpidp
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
x = np.ones(8)
mpidp.allreduce(comm, MPI.IN_PLACE, x)  # collective #0: every rank alike
"""

# name -> (ranks, script after the prelude, extra mpiexec flags, expected cause kind,
#          the rank(s) it names, the collective number it names or None)
SCENARIOS = {
    "skip": (4, """
        mpidp.allreduce(comm, MPI.IN_PLACE, x) if rank != 2 else None  # <site>
        mpidp.bcast(comm, x, root=0)
    """, [], "different_collective", [2], 1),
    "order": (2, """
        if rank == 1:
            mpidp.bcast(comm, x, root=0)
            mpidp.allreduce(comm, MPI.IN_PLACE, x)
        else:
            mpidp.allreduce(comm, MPI.IN_PLACE, x)  # <site>
            mpidp.bcast(comm, x, root=0)
    """, [], "different_collective", [1], 1),
    "count": (7, """
        y = np.ones(7 if rank == 3 else 8)
        mpidp.allreduce(comm, MPI.IN_PLACE, y)  # <site>
    """, [], "arguments", [3], 1),
    "killed": (4, """
        y = np.ones(100000)
        if rank == 1:
            r = mpidp.iallreduce(comm, MPI.IN_PLACE, y, algorithm="ring")
            r.test()
            time.sleep(1)  # the others well into it: start-up's collectives have no deadline
            os.kill(os.getpid(), 9)
        mpidp.allreduce(comm, MPI.IN_PLACE, y, algorithm="ring")
    """, ["-disable-auto-cleanup"], "killed", [1], 1),
    "sleeper": (3, """
        if rank == 2:
            time.sleep(60)  # <site>
        mpidp.allreduce(comm, MPI.IN_PLACE, x)
    """, [], "computing", [2], 1),
    "dups": (3, """
        a, b = comm.Dup(), comm.Dup()
        first, second = (b, a) if rank == 2 else (a, b)
        # the ring: an algorithm that needs no placement (whose query has no deadline)
        mpidp.allreduce(first, MPI.IN_PLACE, x, algorithm="ring")  # <site>
        mpidp.allreduce(second, MPI.IN_PLACE, x, algorithm="ring")
    """, [], "cycle", [2], 0),
    # the same with two Splits of the same members: their ids are agreed on (mpidp.commid)
    "splits": (3, """
        a, b = comm.Split(0, rank), comm.Split(0, rank)
        first, second = (b, a) if rank == 2 else (a, b)
        mpidp.allreduce(first, MPI.IN_PLACE, x, algorithm="ring")  # <site>
        mpidp.allreduce(second, MPI.IN_PLACE, x, algorithm="ring")
    """, [], "cycle", [2], 0),
    "recv": (8, """
        if rank == 4:
            comm.Recv(np.empty(1), source=0, tag=7)  # <site>
        mpidp.allreduce(comm, MPI.IN_PLACE, x)
    """, [], "p2p", [4], 1),
    "ddp": (3, """
        model = mpidp.MLP([4, 8, 8, 3], seed=0)
        dp = mpidp.DataParallel(model, comm, bucket_mb=1e-4, first_bucket_mb=1e-4)
        real = model.backward

        def broken(dout, on_grad=None, **kw):  # one layer's gradients, then it raises
            on_grad(len(model.params) // 2 - 1)
            raise FloatingPointError("overflow in layer 2")

        for step in range(3):
            xb = np.random.default_rng(rank).normal(size=(5, 4)).astype(np.float32)
            loss, dlogits = mpidp.softmax_cross_entropy(dp.forward(xb), np.zeros(5, int))
            model.backward = broken if (rank, step) == (1, 1) else real
            try:
                dp.backward(dlogits)  # <site>
            except FloatingPointError:
                pass  # carries on to the next step, a bucket of this one still in flight
    """, [], "exception", [1], None),
}
DEADLINE_S = "3"


def script_of(name: str) -> str:
    return PRELUDE + textwrap.dedent(SCENARIOS[name][1])


def site_line(name: str) -> int:
    return next(i for i, line in enumerate(script_of(name).splitlines(), 1) if "# <site>" in line)


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """Every scenario launched at once; name -> (its folder, the doctor's JSON and text)."""
    base = tmp_path_factory.mktemp("hangs")
    out = {}
    # the killed rank's job alone, after the others: run beside them it left no record
    # at all in 3 of 5 tries here (why is not known: mpiexec's end taking them with it?)
    batches = [[n for n in SCENARIOS if not SCENARIOS[n][2]],
               [n for n in SCENARIOS if SCENARIOS[n][2] and not OPEN_MPI]]
    for batch in batches:
        out.update(_launch(base, batch))
    # The killed rank's job is launched again (twice at most) if the others left no
    # diagnosable record: Hydra's teardown after a SIGKILL races their dumps (seen in full
    # suite runs at load 8-10, twice in a row once; not reproduced alone). Each launch is
    # judged as strictly.
    for _ in range(2):
        if "killed" not in out or _diagnosed_as(out["killed"], "killed"):
            break
        out.update(_launch(tmp_path_factory.mktemp("hangs-again"), ["killed"]))
    return out


# scenario -> seconds after its launch when mpiexec returned with no process of the job
# left: the launcher ended the surviving ranks with the killed one, before their deadline
TORN_DOWN: dict[str, float] = {}


def _group_alive(pgid: int) -> bool:
    """Is any process of the job (mpiexec's process group) still there?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _torn_down(name: str, folder) -> str | None:
    """Why a scenario's job cannot be diagnosed where the launcher, not mpidp, ended it:
    no record, and no rank left when mpiexec returned (before the deadline)."""
    if name in TORN_DOWN and not list(folder.glob("*.json")):
        return (f"mpiexec ended every rank of the {name} job {TORN_DOWN[name]:.1f} s after "
                f"its launch (its last of up to 3), with the killed one and before their "
                f"{DEADLINE_S} s deadline: Hydra's teardown despite -disable-auto-cleanup, "
                "seen in some full-suite runs; the doctor has no record to read")
    return None


def _diagnosed_as(result, kind: str) -> bool:
    _, _, _, j, _ = result
    try:
        return j.returncode == 0 and json.loads(j.stdout)["cause"]["kind"] == kind
    except (ValueError, KeyError, TypeError):
        return False


def _launch(base, names: list[str]) -> dict:
    procs = {}
    for name in names:
        n, _, flags, *_ = SCENARIOS[name]
        (base / f"{name}.py").write_text(script_of(name))
        env = launch.environ({"MPIDP_TIMEOUT": DEADLINE_S, "MPIDP_DEBUG": "0",
                              "MPIDP_COST": "default", "MPIDP_FLIGHT_DIR": str(base / name)})
        procs[name] = subprocess.Popen(
            launch.command(n, [sys.executable, "-m", "mpidp", str(base / f"{name}.py")],
                           flags), env=env, cwd=base, start_new_session=True,
            # stdin open, or output to pipes: Hydra's mpiexec ended a job at once when a
            # rank was killed, -disable-auto-cleanup or not; so /dev/null and a file
            stdin=subprocess.DEVNULL, stdout=open(base / f"{name}.out", "w"),
            stderr=subprocess.STDOUT)
    started = time.monotonic()
    deadline = started + 60
    folders = {}
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err = (base / f"{name}.out").read_text()
        folder = base / name
        n, _, flags, _, ranks, _ = SCENARIOS[name]
        if flags:  # Hydra's mpiexec returns once a rank is killed; the others dump later
            if not _group_alive(proc.pid):  # ... unless it took them down with it
                TORN_DOWN[name] = time.monotonic() - started
            else:
                TORN_DOWN.pop(name, None)
            while len(list(folder.glob("*.json"))) < n - len(ranks) and \
                    time.monotonic() < deadline and name not in TORN_DOWN:
                time.sleep(0.2)
            time.sleep(0.5)  # the last one's rename
        folders[name] = (folder, proc.returncode, err)
    # the doctor's runs (two per scenario, each a Python start-up) all at once, not in turn;
    # their output to files (a pipe not read while the others run could fill and block)
    doctors = {}
    for name, (folder, _, _) in folders.items():
        for form in (("--json",), ()):
            files = [open(base / f"{name}{''.join(form)}.doctor.{s}", "w+") for s in "12"]
            doctors[name, form] = files, subprocess.Popen(
                [sys.executable, "-m", "mpidp.doctor", str(folder), *form], cwd=base,
                text=True, stdout=files[0], stderr=files[1])
    done = {}
    for key, (files, doctor) in doctors.items():
        doctor.wait(timeout=120)
        stdout, stderr = (f.seek(0) or f.read() for f in files)
        for f in files:
            f.close()
        done[key] = subprocess.CompletedProcess(doctor.args, doctor.returncode, stdout, stderr)
    return {name: (*folders[name], done[name, ("--json",)], done[name, ()])
            for name in folders}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_doctor_names_the_rank_the_call_and_the_cause(diagnosed, name):
    if name not in diagnosed:
        pytest.skip("-disable-auto-cleanup is MPICH Hydra's; not run under Open MPI")
    folder, code, err, j, t = diagnosed[name]
    n, _, _, kind, ranks, seq = SCENARIOS[name]
    if why := _torn_down(name, folder):
        pytest.skip(why)
    assert code != 0, err  # the deadline ended the job
    assert j.returncode == 0 and t.returncode == 0, (j.stderr, t.stderr, err[-3000:])
    d = json.loads(j.stdout)
    cause = d["cause"]
    assert (cause["kind"], cause["ranks"]) == (kind, ranks), (cause, t.stdout)
    if seq is not None:
        assert cause["seq"] == seq, cause
    first = t.stdout.splitlines()[0]
    assert first.startswith("cause: ") and ranks_named(first, ranks), t.stdout
    if name == "ddp":  # the next step's Start of the bucket still in flight raised
        assert "Start of a persistent collective that is still active" in first, first
        # the buckets' persistent all-reduces: the others wait in one, started (its Start
        # recorded on the entry made at DataParallel's construction)
        assert {f["rank"] for f in d["in_flight"] if f["state"] == "started"} >= {0, 2}, \
            d["in_flight"]
    if name != "killed":  # a killed rank has no call site; the others name it
        assert f"{name}.py:{site_line(name)}" in first, (first, site_line(name))
        assert sorted(d["records"]) == list(range(n)), d["records"]
    else:
        assert d["missing"] == [1] and "wait for it in allreduce #1" in first, first


def ranks_named(line: str, ranks: list[int]) -> bool:
    m = re.match(r"cause: (?:ranks?) ([\d, ]+)", line)
    return m is not None and [int(r) for r in m.group(1).split(",")] == ranks


def test_the_skipped_call_names_the_ranks_that_wait_for_it(diagnosed, tmp_path, capsys):
    from mpidp.doctor.__main__ import main

    assert main([str(diagnosed["skip"][0]), "--plot", str(tmp_path / "g.png")]) == 0
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    first = diagnosed["skip"][4].stdout.splitlines()[0]
    assert f"ranks 0, 1, 3 called allreduce at skip.py:{site_line('skip')} and wait in it" \
        in first, first
    assert "waits-for: " in diagnosed["skip"][4].stdout


def test_unreadable_input_is_exit_2(tmp_path, capsys):
    from mpidp.doctor.__main__ import main

    assert main([str(tmp_path / "none")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 2
    assert "no flight record" in capsys.readouterr().err
    (tmp_path / "flight-rank-0.json").write_text("{not json")
    assert main([str(tmp_path)]) == 2
    assert "not a flight record" in capsys.readouterr().err


# the scenarios whose hang lies in the collectives themselves, and two whose lies outside
# them (a rank sleeping, in its own Recv: it shows as finished, the others stall as they did)
REPLAYED = ["skip", "order", "count", "dups", "splits", "sleeper", "recv"]


def in_flight(folder) -> dict[int, set]:
    """rank -> {(communicator, number, round)} of the collectives in flight in its record."""
    out = {}
    for path in sorted(folder.glob("flight-rank-*.json")):
        rec = json.loads(path.read_text())
        out[rec["rank"]] = {(c["id"], k["seq"], k.get("round")) for c in rec["comms"]
                            for k in c["calls"] if k["state"] in ("planned", "started",
                                                                  "timed out")}
    return out


@pytest.mark.parametrize("name", REPLAYED)
def test_the_replay_stalls_the_same_ranks_in_the_same_rounds(diagnosed, name, capsys):
    from mpidp.doctor.__main__ import main

    folder = diagnosed[name][0]
    live = in_flight(folder)
    assert any(live.values()), live  # the records show a hang to reproduce
    assert main([str(folder), "--replay", "--json"]) == 0
    replay = json.loads(capsys.readouterr().out)["replay"]
    got = {int(r): {(s["comm"], s["seq"], s["round"]) for s in x["stalls"]}
           for r, x in replay["ranks"].items()}
    assert got == live, (got, live)
    assert replay["reproduced"] and replay["stalled"] == sorted(r for r in live if live[r])
    assert main([str(folder), "--replay"]) == 0
    out = capsys.readouterr().out
    assert "\nreplay (mpidp.sim" in out and "  reproduced: " in out, out
    assert "not a rank stuck in its own compute or point-to-point" in out


@pytest.mark.parametrize("name", ["killed", "ddp"])
def test_the_replay_says_what_it_cannot_replay(diagnosed, name, capsys):
    if name not in diagnosed:
        pytest.skip("-disable-auto-cleanup is MPICH Hydra's; not run under Open MPI")
    from mpidp.doctor.__main__ import main

    if not diagnosed[name][0].is_dir():  # (the scenario's own test fails for that)
        pytest.skip(f"the {name} scenario's job left no record to replay")
    if why := _torn_down(name, diagnosed[name][0]):
        pytest.skip(why)
    assert main([str(diagnosed[name][0]), "--replay"]) == 0
    out = capsys.readouterr().out
    why = {"killed": "cannot replay: rank 1 left no record",
           "ddp": "a persistent collective (one entry for all its starts)"}[name]
    assert why in out, out


def test_the_help_describes_the_doctor_in_whole_sentences(capsys):
    from mpidp.doctor.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    words = " ".join(capsys.readouterr().out.split())
    assert "why the job whose flight records are in DIR hung, in plain words" in words, words


@pytest.mark.parametrize("where", ["no-such-folder/g.png", "g.txt", "g"])
def test_a_plot_it_cannot_write_is_one_line_and_exit_2_before_any_work(where, tmp_path,
                                                                      capsys, monkeypatch):
    from mpidp.doctor import __main__ as doctor

    def no_work(folder):
        raise AssertionError("the records were read before --plot was checked")

    monkeypatch.setattr(doctor, "read", no_work)
    assert doctor.main([str(tmp_path), "--plot", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mpidp.doctor: error: --plot "), err
    assert str(tmp_path / where) in err, err


def test_a_cycle_is_printed_along_waits_the_edge_list_holds():
    """The strongly connected part {0, 1, 2} of 0 <-> 1 <-> 2 used to print as
    0 -> 1 -> 2 -> 0, through a wait 2 -> 0 that is not there."""
    from mpidp.doctor.graph import cycles as _cycles

    edges = [{"from": a, "to": b} for a, b in ((0, 1), (1, 0), (1, 2), (2, 1))]
    (cycle,) = _cycles(range(3), edges)
    pairs = set(zip(cycle, cycle[1:] + cycle[:1], strict=True))
    assert pairs <= {(e["from"], e["to"]) for e in edges}, cycle
    # a ring of 3000 waits: no recursion limit reached
    ring = [{"from": r, "to": (r + 1) % 3000} for r in range(3000)]
    assert _cycles(range(3000), ring) == [list(range(3000))]


def _finished_record(rank: int, size: int) -> dict:
    import mpidp.farewell as farewell

    stack = [{"file": "/x/script.py", "line": 3, "function": "<module>", "code": "main()"},
             {"file": farewell.__file__, "line": 75, "function": "leave",
              "code": "time.sleep(pause)"}]
    return {"rank": rank, "size": size, "reason": "deadline", "time": 1.0, "job": "j",
            "threads": [{"main": True, "stack": stack}], "comms": []}


def test_a_rank_whose_program_ended_reads_as_finished_not_sleeping():
    from mpidp.doctor import where

    w = where(_finished_record(1, 2))
    assert w["kind"] == "finished" and w["text"].startswith("finished"), w
    assert "sleeping" not in w["text"] and "farewell" not in w["text"], w


def test_the_plot_legend_shows_what_the_picture_holds(tmp_path, monkeypatch):
    from helpers.plots import drawn

    from mpidp.doctor import diagnose
    from mpidp.doctor.plot import draw

    figures = drawn(monkeypatch)
    stuck = {"id": "world", "size": 2, "rank": 0, "members": [0, 1], "calls": [
        {"seq": 0, "t": 0.0, "state": "started", "collective": "allreduce", "count": 8,
         "site": "s.py:1", "round": 1, "pending": [{"peer": 1, "kind": "recv"}]}]}
    records = {0: {"rank": 0, "size": 2, "threads": [], "comms": [stuck], "job": "j"},
               1: _finished_record(1, 2)}
    draw(diagnose(records), str(tmp_path / "g.png"))
    labels = {t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()}
    assert "no record" not in labels and "finished" in labels, labels
    del records[1]
    draw(diagnose(records), str(tmp_path / "g.png"))
    labels = {t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()}
    assert "no record" in labels and "finished" not in labels, labels
