"""The flight recorder: what each communicator keeps of its collectives, the ids that line
ranks up, and the dumps (on demand, on SIGUSR1), checked in the ranks of one job."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
import weakref

import numpy as np
import pytest
from helpers.comms import Loopback
from mpi4py import MPI

import mpidp
from mpidp import endjob, flight, recorder
from mpidp.collectives.state import state


def calls_of(comm) -> list[dict]:
    rec = state(comm).flight
    return [flight._entry(e) for e in rec.calls]


@pytest.mark.mpi(ranks=[1, 3], timeout=60)
def test_each_call_is_recorded_with_its_signature_site_and_state(shared_dir):
    comm = MPI.COMM_WORLD.Dup()
    x = np.ones(5)
    mpidp.allreduce(comm, MPI.IN_PLACE, x, algorithm="ring"); line = sys._getframe().f_lineno  # noqa: E702
    r = mpidp.ibcast(comm, x, root=0, algorithm="binomial")
    with pytest.raises(ValueError):
        mpidp.bcast(comm, x, root=comm.Get_size())  # a bad root: planned, then failed
    r.wait()
    calls = calls_of(comm)
    assert [(c["seq"], c["collective"] if "collective" in c else None, c["state"])
            for c in calls] == [(0, "allreduce", "complete"), (1, "bcast", "complete"),
                                (2, None, "failed")]
    assert calls[0]["site"] == f"{__file__}:{line}"  # the first frame outside mpidp
    assert (calls[0]["count"], calls[0]["dtype"], calls[0]["op"], calls[0]["algorithm"]) == \
        (5, "float64", "sum", "ring")
    assert calls[1]["root"] == 0 and "root" in calls[2]["error"]
    assert [c["blocking"] for c in calls[:2]] == [True, False]  # (the replay reads it)
    # a duplicate's id is its parent's and its place among the parent's duplicates
    ids = comm.allgather(state(comm).flight.comm_id)
    assert len(set(ids)) == 1 and ids[0].startswith("world.")
    path = flight.dump("test", shared_dir)
    with open(path) as f:
        rec = json.load(f)
    assert rec["rank"] == MPI.COMM_WORLD.Get_rank() and rec["reason"] == "test"
    assert any(t["main"] and any(s["file"] == __file__ for s in t["stack"])
               for t in rec["threads"])
    mine = f"flight-rank-{rec['rank']}.json"
    assert not [p for p in os.listdir(shared_dir) if p.startswith(mine + ".")]  # renamed
    comm.Free()


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_the_record_keeps_the_last_k_and_a_request_in_flight_shows_its_round(no_debug_check):
    comm = MPI.COMM_WORLD.Dup()
    x = np.ones(3)
    for _ in range(flight.DEFAULT_K + 5):
        mpidp.allreduce(comm, MPI.IN_PLACE, x, algorithm="ring")
    calls = calls_of(comm)
    assert len(calls) == flight.DEFAULT_K and calls[-1]["seq"] == flight.DEFAULT_K + 4
    if comm.Get_rank() == 1:  # rank 0 has not started it yet: rank 1's round waits
        r = mpidp.iallreduce(comm, MPI.IN_PLACE, x, algorithm="ring")
        live = calls_of(comm)[-1]
        live.update(flight._live(state(comm).flight.calls[-1]))
        assert live["state"] == "started" and live["round"] == 1, live
        assert {"peer": 0, "kind": "recv", "known": True} in live["pending"], live
        comm.Barrier()
    else:
        comm.Barrier()
        r = mpidp.iallreduce(comm, MPI.IN_PLACE, x, algorithm="ring")
    r.wait()
    comm.Free()


@pytest.mark.parametrize("deadline", [None, 30.0])
def test_a_blocking_call_reads_planned_then_started_in_its_rounds_then_complete(
        no_debug_check, monkeypatch, deadline):
    """A blocking call's entry is not written as it starts: it reads "started" (with its
    round) while the driver holds its round or, under a deadline, its request."""
    from mpidp.collectives.engine import completion

    monkeypatch.setattr(completion, "_default_timeout", deadline)
    seen = []

    class Seen(Loopback):  # the entry as a dump reads it when the round's messages go
        def Sendrecv(self, *args):  # noqa: N802
            seen.append(flight._entry(state(self).flight.calls[-1]))
            super().Sendrecv(*args)

        def Irecv(self, *args):  # noqa: N802 - (under a deadline: posted first)
            seen.append(flight._entry(state(self).flight.calls[-1]))
            return super().Irecv(*args)

    comm, x = Seen(), np.ones(1)
    mpidp.allreduce(comm, MPI.IN_PLACE, x, algorithm="recursive_doubling")
    assert x[0] == 2.0 and len(seen) == 1
    assert seen[0]["state"] == "started" and seen[0]["round"] == 1, seen
    assert calls_of(comm)[-1]["state"] == "complete"


def test_an_i_forms_state_is_read_from_its_request(no_debug_check):
    """An I-form's entry stores no state as it starts or completes: a dump reads started
    while its request is in flight, complete once it is done; one whose first round
    raises as it is posted reads failed (not planned, which the doctor takes for a hang)."""
    class Posting(Loopback):  # its receive posted, its send not yet
        def Isend(self, buf, dest, tag):  # noqa: N802
            self.pending = buf[0]
            return MPI.REQUEST_NULL

    comm, x = Posting(), np.ones(1)
    req = mpidp.iallreduce(comm, MPI.IN_PLACE, x, algorithm="recursive_doubling")
    assert calls_of(comm)[-1]["state"] == "started"
    comm.into[...] = comm.pending
    req.wait()
    assert x[0] == 2.0 and calls_of(comm)[-1]["state"] == "complete"
    # the entry holds the request, and a done request holds no comm: else this comm-like
    # would live as long as its own state (`state._unwrapped`), its recorder in a later
    # test's dump of a 1-rank job (a 2-rank comm there: the doctor refuses the record)
    posted = weakref.ref(state(comm).flight)
    del comm, req

    class Refusing(Loopback):
        def Isend(self, buf, dest, tag):  # noqa: N802
            raise RuntimeError("the link is down")

    comm = Refusing()
    with pytest.raises(RuntimeError, match="link"):
        mpidp.iallreduce(comm, MPI.IN_PLACE, x, algorithm="recursive_doubling")
    last = calls_of(comm)[-1]
    assert last["state"] == "failed" and "link is down" in last["error"], last
    refused = weakref.ref(state(comm).flight)
    del comm
    gc.collect()  # (the failed request and its exception's traceback hold each other)
    assert posted() is None and refused() is None


@pytest.mark.mpi(ranks=[1], timeout=60)
def test_sigusr1_dumps_while_the_program_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIDP_FLIGHT_DIR", str(tmp_path))
    assert flight.install() or flight._installed
    os.kill(os.getpid(), signal.SIGUSR1)
    path = tmp_path / "flight-rank-0.json"
    end = time.monotonic() + 10
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert json.loads(path.read_text())["reason"] == "SIGUSR1"


def test_mpidp_flight_0_records_nothing(monkeypatch):
    monkeypatch.setenv("MPIDP_FLIGHT", "0")
    assert flight.recorder(MPI.COMM_SELF) is None
    monkeypatch.setenv("MPIDP_FLIGHT", "7")
    assert flight.recorder(MPI.COMM_SELF).calls.maxlen == 7


def test_the_call_site_is_the_programs_line_whichever_way_the_call_came():
    """The recorder tries the frame where the last call site was first (`Recorder.add`):
    entry points of other depths, one after another, each still name the program's line."""
    comm = MPI.COMM_SELF.Dup()
    x, wrapped, lines = np.ones(2), mpidp.Comm(comm), []

    def nested():
        mpidp.allreduce(comm, MPI.IN_PLACE, x); return sys._getframe().f_lineno  # noqa: E702

    for how in ("api", "Comm", "api", "nested", "Comm", "nested", "i", "api"):
        if how == "api":
            mpidp.allreduce(comm, MPI.IN_PLACE, x); lines.append(sys._getframe().f_lineno)  # noqa: E702
        elif how == "Comm":
            wrapped.Allreduce(MPI.IN_PLACE, x); lines.append(sys._getframe().f_lineno)  # noqa: E702
        elif how == "nested":
            lines.append(nested())
        else:
            wrapped.Iallreduce(MPI.IN_PLACE, x).Wait(); lines.append(sys._getframe().f_lineno)  # noqa: E702
    assert [c["site"] for c in calls_of(comm)] == [f"{__file__}:{n}" for n in lines]
    walked = []
    real, recorder._walk = recorder._walk, lambda: walked.append(1) or real()
    try:
        for _ in range(3):  # the way the last one came: found without walking up
            mpidp.allreduce(comm, MPI.IN_PLACE, x); line = sys._getframe().f_lineno  # noqa: E702
    finally:
        recorder._walk = real
    assert walked == [] and calls_of(comm)[-1]["line"] == line
    comm.Free()


def test_a_failing_programs_record_is_written_before_its_traceback(tmp_path, monkeypatch):
    """The traceback goes to stderr through the launcher, which may be slow or gone: the
    record is written first."""

    class Aborted(BaseException):
        pass

    def abort(message, code, comm):
        raise Aborted(message)

    monkeypatch.setenv("MPIDP_FLIGHT_DIR", str(tmp_path))
    for name, value in (("abort", abort), ("_exit_later", lambda code: None),
                        ("_dumped", None), ("_raised", None)):
        monkeypatch.setattr(endjob, name, value)
    monkeypatch.setattr(flight, "ending", False)
    monkeypatch.setattr(flight, "ask_peers", lambda: None)
    printed = []
    monkeypatch.setattr(endjob.traceback, "print_exception",
                        lambda *a: printed.append(sorted(os.listdir(tmp_path))))
    with pytest.raises(Aborted, match="prog.py failed: RuntimeError: x"):
        endjob.end_job(RuntimeError("x"), "prog.py", None)
    assert printed == [["flight-rank-0.json"]]
    assert endjob._dumped == str(tmp_path / "flight-rank-0.json")  # abort writes no other


def test_mpidp_flight_has_an_upper_bound_checked_before_the_first_collective(monkeypatch):
    """10**30 passed the launcher's check, then the deque's maxlen overflowed at the first
    collective: it is refused where every variable is checked, naming the bound."""
    from mpidp import config

    for text in (str(10**30), str(config.FLIGHT_MAX + 1)):
        monkeypatch.setenv("MPIDP_FLIGHT", text)
        problems = config.problems()
        assert len(problems) == 1 and problems[0].startswith(f"MPIDP_FLIGHT={text!r}"), problems
        assert f"at most {config.FLIGHT_MAX}" in problems[0], problems
    monkeypatch.setenv("MPIDP_FLIGHT", str(config.FLIGHT_MAX))
    assert flight.recorder(MPI.COMM_SELF).calls.maxlen == config.FLIGHT_MAX


def test_mpidp_flight_dir_expands_a_tilde(tmp_path, monkeypatch):
    """'~/fl' wrote a folder literally named '~' in the working folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MPIDP_FLIGHT_DIR", "~/fl")
    monkeypatch.chdir(tmp_path)
    assert flight.folder() == str(tmp_path / "home" / "fl")
    path = flight.dump("test")
    assert path == str(tmp_path / "home" / "fl" / "flight-rank-0.json")
    assert not (tmp_path / "~").exists()


def test_a_dump_follows_no_link_planted_in_a_shared_folder(tmp_path, monkeypatch):
    """The dump's temporary file had a predictable name (``<record>.<pid>.tmp``), opened
    following links: a link planted there (a shared MPIDP_FLIGHT_DIR under /tmp) had mpidp
    overwrite its target. Links at that name, at the temporary names the writer draws, and
    at the record's own name are never followed; the targets outside stay untouched."""
    import tempfile

    shared, outside = tmp_path / "shared", tmp_path / "outside"
    shared.mkdir()
    outside.mkdir()
    record = shared / "flight-rank-0.json"
    planted = {record.name + f".{os.getpid()}.tmp": "old temporary name",
               ".flight-rank-0.json.AAAA.tmp": "drawn name 1",
               ".flight-rank-0.json.BBBB.tmp": "drawn name 2",
               record.name: "the record's own name"}
    for i, (name, _) in enumerate(planted.items()):
        (outside / f"victim{i}").write_text("precious")
        os.symlink(outside / f"victim{i}", shared / name)
    drawn = iter(["AAAA", "BBBB", "CCCC"])  # the writer's first two draws hit the links

    class Names:
        def __iter__(self):
            return self

        def __next__(self):
            return next(drawn)

    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: Names())
    path = flight.dump("test", str(shared))
    assert path == str(record) and not record.is_symlink()
    assert json.loads(record.read_text())["reason"] == "test"
    for i, why in enumerate(planted.values()):
        assert (outside / f"victim{i}").read_text() == "precious", why
    assert sorted(p.name for p in shared.iterdir()) == sorted(planted)  # no temporary left


def test_the_launcher_asks_a_rank_whose_record_is_an_earlier_jobs(tmp_path, monkeypatch):
    """A record left in the folder by an earlier job stopped the launcher from asking that
    rank of this job for its own (SIGUSR1): only a record of this job, by that very process,
    counts as the rank's."""
    import socket

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("MPIDP_FLIGHT_DIR", str(tmp_path))
    host = socket.gethostname()
    peers = [(host, os.getpid()), (host, 1001), (host, 1002), (host, 1003), (host, 1004)]
    monkeypatch.setattr(flight, "_peers", peers)
    this = flight.job_id()
    written = {1: {"job": "slurm:41.", "pid": 1001},  # the earlier job's rank 1
               2: {"job": this, "pid": 1002},  # this job's rank 2: asked no more
               3: {"job": this, "pid": 999}}  # this job's id, another process
    for r, fields in written.items():
        (tmp_path / f"flight-rank-{r}.json").write_text(json.dumps({"rank": r, **fields}))
    (tmp_path / "flight-rank-4.json").write_text("{cut off")
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    flight.ask_peers()
    assert sorted(sent) == [(1001, signal.SIGUSR1), (1003, signal.SIGUSR1),
                            (1004, signal.SIGUSR1)], sent


@pytest.mark.mpi(ranks=[3], timeout=60)
def test_two_splits_with_the_same_members_get_ids_their_members_agree_on(no_debug_check):
    """Two Splits of the same members, used in opposite orders on one rank (I-forms: no
    deadlock here), used to be named by each rank's order of first use: rank 2's first was
    the others' second, so one id named different communicators on different ranks."""
    world = MPI.COMM_WORLD
    a, b = world.Split(0, world.Get_rank()), world.Split(0, world.Get_rank())
    x, y = np.ones(4), np.ones(4)
    first, second = (b, a) if world.Get_rank() == 2 else (a, b)
    r1 = mpidp.iallreduce(first, MPI.IN_PLACE, x, algorithm="ring")
    r2 = mpidp.iallreduce(second, MPI.IN_PLACE, y, algorithm="ring")
    while not (r1.test() & r2.test()):  # both driven: each waits for the other's on rank 2
        os.sched_yield()
    end = time.monotonic() + 20
    while not all(getattr(state(c).flight, "agreeing", None) is None for c in (a, b)) \
            and time.monotonic() < end:
        time.sleep(0.01)  # (each look takes in the numbers that arrived)
        [state(c).flight.comm_id for c in (a, b)]
    ids = world.allgather((state(a).flight.comm_id, state(b).flight.comm_id))
    assert len(set(ids)) == 1 and ids[0][0] != ids[0][1], ids
    assert "?" not in ids[0][0] + ids[0][1], ids
    rec = {c["id"]: c for c in flight.record("test")["comms"]}
    assert rec[ids[0][0]]["parts"] == [0, 0, 1] and rec[ids[0][1]]["parts"] == [1, 1, 0]
    a.Free()
    b.Free()


def test_a_request_never_waited_on_is_named_at_exit(tmp_path, mpiexec):
    """An I-form whose request the program never waits on left only MPI's own words at
    exit (MPICH: "pending references"): each rank names it, in one line on stderr."""
    import subprocess
    import textwrap

    script = tmp_path / "unwaited.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        from mpi4py import MPI
        import mpidp
        comm = MPI.COMM_WORLD.Dup()
        x = np.ones(1 << 12)
        mpidp.allreduce(comm, MPI.IN_PLACE, x, algorithm="ring")
        request = mpidp.iallreduce(comm, MPI.IN_PLACE, x, algorithm="ring")  # never waited
        comm.Barrier()
    """))
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "HYDRA_", "PYTEST_ISOLATE_MPI"))}
    p = subprocess.run([*mpiexec, "-n", "2", sys.executable, str(script)], env=clean,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = [x for x in p.stderr.splitlines() if x.startswith("mpidp: rank ")]
    assert len(lines) == 2, p.stderr
    for r in (0, 1):
        line = next(x for x in lines if x.startswith(f"mpidp: rank {r} of 2: at exit, "))
        assert f"allreduce #1 on world.0 (called at {script}:8) was started and never " \
               "completed (its request never waited on)" in line, line


class _Req:
    def __init__(self, done: bool):
        self.done, self.cancelled = done, False

    def Test(self):  # noqa: N802 - mpi4py's name
        return self.done

    def Cancel(self):  # noqa: N802
        self.cancelled = self.done = True


class _TwoRanks:
    """A communicator of 2 whose other member never uses it: its number never arrives."""

    def __init__(self):
        self.recvs = []

    def Get_size(self):  # noqa: N802
        return 2

    def Get_rank(self):  # noqa: N802
        return 0

    def Isend(self, buf, dest, tag):  # noqa: N802
        return _Req(True)

    def Irecv(self, buf, source, tag):  # noqa: N802
        self.recvs.append(_Req(False))
        return self.recvs[-1]


def test_an_agreements_receives_still_posted_at_exit_are_cancelled():
    """A Split communicator's other member never used it: the receive of its number stays
    posted; flight's at-exit hook cancels it before MPI_Finalize (no pending request left
    for a user's ANY_TAG receive to take, nor for MPI to complain of)."""
    from mpidp import commid

    comm = _TwoRanks()
    agreement = commid.Agreement(comm, "gdeadbeef", 0, 7)
    assert not agreement.progress() and not comm.recvs  # nothing posted before a collective
    agreement.post()  # its first collective starts
    assert not agreement.progress() and not comm.recvs[0].cancelled
    flight._at_exit()
    assert comm.recvs[0].cancelled and agreement.parts == [0, None]


# ------------------------------------------------ the driver hands the recorder what runs


def test_no_module_reads_a_frames_locals():
    """The recorder is handed the request (`driver.run`'s `entry`): no module of mpidp
    reads another function's locals out of a frame or a traceback."""
    import ast
    from pathlib import Path

    root = Path(mpidp.__file__).parent
    found = [f"{p.relative_to(root)}:{n.lineno}" for p in sorted(root.rglob("*.py"))
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Attribute) and n.attr == "f_locals"]
    assert found == []


def test_the_blocking_driver_hands_the_record_its_round_and_its_request(monkeypatch):
    """Without a deadline the entry holds (rounds done, the round in flight) while it runs,
    `DONE` once they have run (the entry's state then reads complete), None if they raised;
    under one, the `Request`, which a passed deadline leaves for the dump to read."""
    from mpidp.collectives.algorithms.rounds import Recv, Send
    from mpidp.collectives.engine import completion, driver

    comm = MPI.COMM_SELF.Dup()
    entry, seen = [None] * (flight.RUNNING + 1), []

    def two_rounds():
        x, y = np.ones(3), np.zeros(3)
        for _ in range(2):
            yield [Send(x, 0), Recv(y, 0)]
            seen.append(entry[flight.RUNNING])

    assert driver.run(comm, two_rounds(), 11, entry=entry) == 2
    assert [count for count, _ in seen] == [0, 1] and entry[flight.RUNNING] is flight.DONE
    assert [type(m).__name__ for m in seen[1][1]] == ["Send", "Recv"]
    entry[flight.STATE] = flight.PLANNED
    assert flight._state(entry) == flight.COMPLETE

    def raises():
        yield [Send(np.ones(3), 0), Recv(np.zeros(3), 0)]
        raise FloatingPointError("overflow")

    with pytest.raises(FloatingPointError):
        driver.run(comm, raises(), 13, entry=entry)
    assert entry[flight.RUNNING] is None  # not complete: `fail` says why

    def never_sent():
        yield [Recv(np.zeros(3), 0)]

    monkeypatch.setattr(completion, "_default_timeout", 0.2)
    entry[flight.TAG] = 12
    with pytest.raises(TimeoutError) as err:
        driver.run(comm, never_sent(), 12, entry=entry)
    flight.fail(entry, err.value)
    assert isinstance(entry[flight.REQUEST], driver.Request)
    assert flight._live(entry) == {"round": 1, "done": False,
                                   "pending": [{"peer": 0, "kind": "recv", "known": True}]}
    comm.Send(np.zeros(3), 0, 12)  # let the receive complete before the comm goes
    monkeypatch.setattr(completion, "_default_timeout", None)
    entry[flight.REQUEST].wait()
    comm.Free()
