"""Hostile flight records: the doctor (and its --replay) on folders a careless or hostile
user could leave. Each is one line naming the file and the field, exit code 2, or a right
diagnosis: never a hang, a traceback or a huge allocation. The records start from a real
one (`flight.record()` after a real collective); the property tests mutate it at random.

The cases that hung or allocated before run the doctor as a command with a timeout, so a
regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpidp
from mpidp import flight
from mpidp.doctor.__main__ import main

TIMEOUT_S = 60  # a doctor's run takes ~1 s; one that has not ended by then hangs


def _real_call() -> tuple[dict, dict]:
    """(a record, one complete all-reduce call of it) from a real collective here."""
    comm = MPI.COMM_SELF.Dup()
    try:
        mpidp.allreduce(comm, MPI.IN_PLACE, np.ones(8), algorithm="ring")
        rec = json.loads(json.dumps(flight.record("test"), default=str))
    finally:
        comm.Free()
    call = next(k for c in rec["comms"] for k in c["calls"]
                if k.get("collective") == "allreduce" and k["count"] == 8)
    return rec, call


BASE, CALL = _real_call()


def job(n: int, job_id: str = "job:new", t: float = 2.0, missing=(), calls=None) -> dict:
    """{rank: record} of an n-rank job whose ranks but `missing` wait in all-reduce #1 for
    their left neighbour (`calls(rank)`: each rank's calls instead)."""
    out = {}
    for r in range(n):
        if r in missing:
            continue
        rec = copy.deepcopy(BASE)
        rec.update(rank=r, size=n, job=job_id, time=t, exception=None)
        if calls is None:
            first = dict(CALL, seq=0, state="complete")
            stuck = dict(CALL, seq=1, state="started", round=1, done=False, blocking=True,
                         pending=[{"peer": (r - 1) % n, "kind": "recv", "known": True}])
            mine = [first, stuck]
        else:
            mine = calls(r)
        rec["comms"] = [{"id": "world", "how": "creation", "size": n, "rank": r,
                         "members": list(range(n)), "calls": mine}]
        out[r] = rec
    return out


def write(folder, records: dict, names=None) -> None:
    os.makedirs(folder, exist_ok=True)
    for r, rec in records.items():
        name = (names or {}).get(r, f"flight-rank-{r}.json")
        with open(os.path.join(folder, name), "w") as f:
            json.dump(rec, f)


def doctor(*args, timeout=TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpidp.doctor", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def one_line_exit_2(p: subprocess.CompletedProcess, *words) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("mpidp.doctor: error: "), p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    return p.stderr


def test_a_real_job_of_these_records_is_diagnosed(tmp_path):
    """The records the other tests spoil: as written, they name the cycle of waits."""
    write(tmp_path, job(3))
    p = doctor(tmp_path, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["records"] == [0, 1, 2] and d["cycles"], d["cause"]


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    write(tmp_path, job(2, missing=(1,)))
    os.mkfifo(tmp_path / "flight-rank-1.json")
    one_line_exit_2(doctor(tmp_path), "flight-rank-1.json", "not a regular file")


def test_a_symlink_is_refused_its_target_not_read(tmp_path):
    folder, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    write(folder, job(2, missing=(1,)))
    write(elsewhere, job(2, missing=(0,)))
    os.symlink(elsewhere / "flight-rank-1.json", folder / "flight-rank-1.json")
    one_line_exit_2(doctor(folder), "flight-rank-1.json", "cannot be read")


@pytest.mark.parametrize("field, value, named", [
    ("size", 10**12, "size"),
    ("rank", -1, "rank"),
    ("rank", 5, "rank: 5 is not below size 2"),
    ("comms", {"id": "world"}, "comms"),
    ("threads", "none", "threads"),
])
def test_a_field_out_of_bounds_is_one_line_naming_it(tmp_path, field, value, named):
    recs = job(2)
    recs[0][field] = value
    write(tmp_path, recs)
    one_line_exit_2(doctor(tmp_path), "flight-rank-0.json", named)


@pytest.mark.parametrize("spoil, named", [
    (lambda c: c.update(count=10**15), "calls[1].count"),
    (lambda c: c.update(state="asleep"), "calls[1].state"),
    (lambda c: c.update(pending=[{"peer": 7, "kind": "recv"}]), "calls[1].pending[0].peer: 7"),
    (lambda c: c.update(pending=[{"peer": 1, "kind": 3}]), "calls[1].pending[0].kind"),
    (lambda c: c.update(seq="1"), "calls[1].seq"),
    (lambda c: c.pop("t"), "calls[1]: no field 't'"),
])
def test_a_call_out_of_bounds_is_one_line_naming_it(tmp_path, spoil, named):
    recs = job(2)
    spoil(recs[1]["comms"][0]["calls"][1])
    write(tmp_path, recs)
    one_line_exit_2(doctor(tmp_path), "flight-rank-1.json", "comms[0]." + named)


def test_deep_nesting_is_refused_before_json_recurses(tmp_path):
    recs = job(2)
    write(tmp_path, recs)
    deep = json.dumps(recs[0])[:-1] + ', "x": ' + "[" * 10000 + "]" * 10000 + "}"
    (tmp_path / "flight-rank-0.json").write_text(deep)
    one_line_exit_2(doctor(tmp_path), "flight-rank-0.json", "nested more than")


def test_another_jobs_records_are_set_aside_with_a_note_at_the_top(tmp_path):
    """An earlier 3-rank job left rank 2's record; in this one rank 2 left none (killed):
    the old record must not stand in for it, nor the two jobs break the doctor."""
    write(tmp_path, job(3, "job:old", t=1.0))
    for r in (0, 1):
        os.remove(tmp_path / f"flight-rank-{r}.json")
    write(tmp_path, job(3, "job:new", t=2.0, missing=(2,)))
    p = doctor(tmp_path)
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()[:2]
    assert first.startswith("note: set aside 1 record(s) of another, earlier job (job:old): "
                            "flight-rank-2.json"), p.stdout
    assert second.startswith("cause: rank 2 left no record"), p.stdout
    # the other way round: the old job's two records and the new job's one
    write(tmp_path, job(3, "job:old", t=1.0))
    write(tmp_path, job(3, "job:new", t=5.0, missing=(0, 1)))
    d = json.loads(doctor(tmp_path, "--json").stdout)
    assert d["records"] == [2] and d["missing"] == [0, 1], d
    assert "job:old" in d["warnings"][0] and "flight-rank-0.json, flight-rank-1.json" in \
        d["warnings"][0], d["warnings"]


def test_sizes_that_differ_within_a_job_are_refused(tmp_path):
    recs = job(3)
    recs[2].update(size=4)
    recs[2]["comms"] = []
    write(tmp_path, recs)
    one_line_exit_2(doctor(tmp_path), "size", "[3, 4]")


@pytest.mark.parametrize("spoil, why", [
    (lambda c: c.update(count=10**11), "bytes"),  # 745 GiB of float64
    (lambda c: c.update(dtype="object"), "dtype 'object'"),
    (lambda c: c.update(dtype="no such type"), "dtype 'no such type'"),
])
def test_a_replay_it_cannot_afford_or_read_is_refused_in_one_line(tmp_path, spoil, why):
    recs = job(2)
    for r in recs:
        spoil(recs[r]["comms"][0]["calls"][1])
    write(tmp_path, recs)
    p = doctor(tmp_path, "--replay", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    replay = json.loads(p.stdout)["replay"]
    assert replay["error"].startswith("cannot replay: ") and why in replay["error"], replay
    assert "\n" not in replay["error"] and not replay["reproduced"]


# ------------------------------------------------------------ property tests

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


def paths(value, at=()):
    """Every place in a JSON value, as the keys and indices that lead to it."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*at, i))


def mutate(rec, path, how, new):
    if not path:
        return new
    parent = rec
    for p in path[:-1]:
        parent = parent[p]
    if how == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return rec


def run_doctor(records: dict) -> None:
    """The doctor and its replay on `records`: a diagnosis (0) or one clean line (2)."""
    with tempfile.TemporaryDirectory() as folder:
        write(folder, records)
        for args in ([folder, "--json"], [folder, "--replay"]):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = main(args)
            assert code in (0, 2), code
            if code == 2:
                assert out.getvalue().count("\n") == 1, out.getvalue()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_mutated_record_is_refused_cleanly_or_diagnosed(data):
    recs = job(3)
    r = data.draw(st.sampled_from(sorted(recs)))
    places = list(paths(recs[r]))
    path = data.draw(st.sampled_from(places))
    how = data.draw(st.sampled_from(["replace", "delete"]))
    recs[r] = mutate(recs[r], path, how, data.draw(JSON))
    run_doctor(recs)


FIELDS = {"seq": st.integers(-3, 6) | st.none(), "state": st.sampled_from(
    ["planned", "started", "complete", "failed", "timed out", "persistent"]),
    "round": st.integers(0, 5) | st.none(), "count": st.integers(0, 64) | st.lists(
        st.integers(0, 9), max_size=4) | st.lists(  # nested: an exact sum's (counts, addends)
        st.integers(0, 9) | st.lists(st.integers(0, 9), max_size=3), max_size=3),
    "algorithm": st.sampled_from(
        ["ring", "rabenseifner", "recursive_doubling", "naive", "ring+ring", "auto", "x"]),
    "collective": st.sampled_from(["allreduce", "bcast", "allgather", "reduce_scatter", "?"]),
    "root": st.integers(0, 3) | st.none(), "blocking": st.booleans(),
    "dtype": st.sampled_from(["float64", "float32", "int8", "bool", "object", "V3"])}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_records_whose_fields_are_well_typed_but_inconsistent_are_handled(data):
    """Each field of the right type and within bounds, but the calls disagree across ranks
    in every way: a diagnosis, or a clean refusal, never another exception."""
    n = data.draw(st.integers(1, 4))

    def calls(r):
        out = []
        for _ in range(data.draw(st.integers(0, 3))):
            k = dict(CALL, t=data.draw(st.floats(0, 10)))
            for name, strategy in FIELDS.items():
                if data.draw(st.booleans()):
                    k[name] = data.draw(strategy)
            if "pending" in k or data.draw(st.booleans()):
                k["pending"] = [{"peer": data.draw(st.integers(0, n - 1)),
                                 "kind": data.draw(st.sampled_from(["send", "recv"]))}]
            out.append(k)
        return out

    missing = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 1))
    run_doctor(job(n, missing=missing, calls=calls))


def test_a_splits_records_are_lined_up_by_the_numbers_its_members_know():
    """Ranks 0, 1 wait in Split a (their first of two with these members), rank 2 in b (its
    first): each record knows the numbers that arrived. Ranks 0 and 1 know each other's,
    so theirs is one communicator; rank 2 knows neither's: another."""
    from mpidp import commid
    from mpidp.doctor import diagnose
    from mpidp.doctor.records import name_of, unify

    known = {0: [0, 0, None], 1: [0, 0, None], 2: [None, None, 0]}

    def calls(r):
        return [dict(CALL, seq=0, state="started", round=1, done=False,
                     pending=[{"peer": (r - 1) % 3, "kind": "recv"}])]

    recs = job(3, calls=calls)
    for r, rec in recs.items():
        rec["comms"][0].update(id=name_of("g1234abcd", [p if i == r else None
                                                       for i, p in enumerate(known[r])]),
                               how="first use", parts=known[r])
    unify(recs)
    ids = [recs[r]["comms"][0]["id"] for r in range(3)]
    assert ids[0] == ids[1] == "g1234abcd#0-0-?" and ids[2] == "g1234abcd#?-?-0", ids
    d = diagnose(recs)
    # (the stacks are this test's: rank 2 reads as computing, not in a collective)
    assert d["cycles"] == [[0, 2, 1]] and d["cause"]["ranks"] == [2], (d["cycles"], d["cause"])
    assert d["cause"]["comm"] == ids[0], d["cause"]
    for parts in ([0, 0, 0], [1, 0, 2], [None, 3, None]):
        assert name_of("g1", parts) == commid.name_of("g1", parts)


def test_a_real_exact_reduce_scatter_record_is_diagnosed(tmp_path):
    """An exact reduce-scatter records its count as [per-rank counts, addends] (a list in a
    list): the doctor diagnoses its record instead of raising (unhashable list)."""
    from mpidp.collectives.api import ireduce_scatter_parts

    comm = MPI.COMM_SELF.Dup()
    try:
        parts = [np.ones(4), np.ones(4)]
        ireduce_scatter_parts(comm, parts, np.zeros(4), [4], addends=2).wait()
        flight.dump("test", where=str(tmp_path))
    finally:
        comm.Free()
    rec = json.loads((tmp_path / f"flight-rank-{MPI.COMM_WORLD.rank}.json").read_text())
    counts = [k.get("count") for c in rec["comms"] for k in c["calls"]]
    assert any(isinstance(n, list) and any(isinstance(x, list) for x in n)
               for n in counts), counts
    p = doctor(tmp_path, "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["records"] == [MPI.COMM_WORLD.rank]


def _calls(n: int, state: str = "complete") -> list[dict]:
    small = {k: CALL[k] for k in ("state", "t", "collective", "count", "dtype", "op")}
    return [dict(small, seq=s, state=state) for s in range(n)]


def test_many_calls_on_each_rank_are_diagnosed_in_time(tmp_path):
    """4 ranks of 65536 calls each (MPIDP_FLIGHT at its bound): in time, not in
    a time quadratic in the calls (each seq looking over every rank's calls again)."""
    N = 1 << 16
    recs = job(4, calls=lambda r: _calls(N - 1 - r) + [dict(_calls(1)[0], seq=N - 1 - r,
                                                                state="started")])
    write(tmp_path, recs)
    p = doctor(tmp_path, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["first_difference"]["seq"] == N - 3


def test_a_wide_job_of_few_records_is_diagnosed_in_time(tmp_path):
    """One record of a 65536-rank job, 4 calls started with no round known (so waiting for
    every other member): the ranks without a record are found in time."""
    n = 1 << 16
    rec = copy.deepcopy(BASE)
    rec.update(rank=0, size=n, job="job:wide", time=1.0, exception=None)
    rec["comms"] = [{"id": "world", "how": "creation", "size": n, "rank": 0,
                     "members": list(range(n)), "calls": _calls(4, "started")}]
    write(tmp_path, {0: rec})
    p = doctor(tmp_path, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d["cause"]["kind"] == "killed" and len(d["cause"]["ranks"]) == n - 1, d["cause"]


def test_more_waits_than_the_doctor_draws_are_one_line(tmp_path):
    """A record within the schema's bounds (2^20 members, 4 calls in flight with no round,
    so each waits for every other member) asks for 4 * 2^20 arrows: refused in one line,
    not drawn until the memory runs out."""
    n = 1 << 20
    rec = copy.deepcopy(BASE)
    rec.update(rank=0, size=n, job="job:wide", time=1.0, exception=None)
    rec["comms"] = [{"id": "world", "how": "creation", "size": n, "rank": 0,
                     "members": list(range(n)), "calls": _calls(4, "started")}]
    write(tmp_path, {0: rec})
    one_line_exit_2(doctor(tmp_path, "--json"), "wait for more than")


def test_a_folder_of_more_bytes_than_the_doctor_reads_is_one_line(tmp_path, monkeypatch):
    """The records of a folder are read up to FOLDER_MAX_BYTES together (each file is
    bounded, their number is not): beyond, one line naming the file it stopped at."""
    from mpidp.doctor import records

    write(tmp_path, job(3))
    size = sum(f.stat().st_size for f in tmp_path.iterdir())
    monkeypatch.setattr(records, "FOLDER_MAX_BYTES", size - 1)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path)]) == 2
    assert err.getvalue().count("\n") == 1 and "flight-rank-2.json" in err.getvalue(), \
        err.getvalue()
    monkeypatch.setattr(records, "FOLDER_MAX_BYTES", size)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(tmp_path)]) == 0


def test_records_without_a_job_id_say_so_and_another_runs_are_set_aside(tmp_path):
    """No job id (plain mpiexec under MPICH): a note says so at the top; a record from
    the same host under another launcher process (its parent pid: one per host and job)
    is another run's, set aside, so it never stands in for this run's rank 2."""
    recs = job(3, job_id=None, t=5.0)
    for r, rec in recs.items():
        rec.update(host="vm", pid=100 + r, ppid=99)
    recs[2].update(ppid=42, pid=7, time=1.0)  # an earlier run's rank 2
    write(tmp_path, recs)
    p = doctor(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    head = p.stdout.splitlines()[:2]
    assert "no job id" in head[0] and "flight-rank-2.json" in head[1], head
    assert "rank 2 left no record" in p.stdout, p.stdout[:2000]
