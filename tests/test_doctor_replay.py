"""The doctor's replay on records written here (no MPI): each rank's calls in the order it
made them, blocking or not, from where every rank still has them. The replay of real
dumps is in tests/test_doctor.py."""

from __future__ import annotations

from mpidp.collectives.state import CommState, signature
from mpidp.doctor.replay import replay, text

STATE = CommState(tag_ub=2**31 - 1)


def call(seq, t, state="complete", blocking=True, count=8, algorithm="ring"):
    return {"seq": seq, "t": t, "state": state, "blocking": blocking, "collective": "allreduce",
            "count": count, "dtype": "float64", "op": "sum", "algorithm": algorithm,
            "tag": STATE.tag(seq, signature("allreduce", count, algorithm)), "site": "x.py:1"}


def records(calls: dict) -> dict:
    """{rank: record} from {rank: {communicator: [calls]}}, each over all ranks."""
    size = len(calls)
    return {r: {"rank": r, "size": size, "host": "h", "threads": [], "comms": [
        {"id": cid, "size": size, "rank": r, "members": list(range(size)), "calls": ks}
        for cid, ks in comms.items()]} for r, comms in calls.items()}


def test_calls_are_replayed_in_each_ranks_order_and_an_iform_runs_beside_the_next():
    def job(blocking):  # rank 0: world then world.0; rank 1: world.0 then world
        return records({0: {"world": [call(0, 1.0, "timed out", blocking)],
                            "world.0": [call(0, 2.0, "timed out")]},
                        1: {"world.0": [call(0, 1.0, "timed out")],
                            "world": [call(0, 2.0)]}})

    stuck = replay(job(blocking=True))  # (a record no run writes: it tests the flag)
    assert stuck["stalled"] == [0, 1], stuck
    assert [s["comm"] for r in (0, 1) for s in stuck["ranks"][r]["stalls"]] == ["world", "world.0"]
    # rank 0's first call an I-form: both complete, as they did not in the records
    free = replay(job(blocking=False))
    assert free["stalled"] == [] and not free["reproduced"]
    assert "not reproduced: every recorded collective completes" in "\n".join(text(free))


def test_the_replay_starts_where_every_rank_still_has_its_calls():
    long = [call(s, float(s)) for s in range(6)]  # rank 1 kept #0-#5
    short = [call(s, float(s)) for s in range(3, 6)]  # rank 0, #3-#5 only (MPIDP_FLIGHT=3)
    d = replay(records({0: {"world": short + [call(6, 6.0, "timed out")]},
                        1: {"world": long}}))
    assert any("replayed from #3 on" in n for n in d["notes"]), d["notes"]
    assert d["stalled"] == [0] and d["ranks"][0]["stalls"][0]["seq"] == 6
    assert d["reproduced"] and d["ranks"][1]["calls"] == 3


def test_what_the_simulator_cannot_run_alone_is_left_out_and_said():
    exact = dict(call(1, 1.0), algorithm="ring+ring")
    d = replay(records({0: {"world": [call(0, 0.0), exact]}, 1: {"world": [call(0, 0.0)]}}))
    assert d["stalled"] == [] and "left out: rank 0: allreduce #1 on world" in d["notes"][0]
    d = replay(records({0: {"world": [dict(call(0, 0.0), state="persistent")]},
                        1: {"world": [call(0, 0.0)]}}))
    assert "cannot replay" in d["error"] and "persistent" in d["error"]


def test_a_rank_stuck_in_a_call_the_replay_leaves_out_is_not_finished_nor_reproduced():
    """Rank 0 hangs in an exact sum (its two passes one entry: left out), rank 1 in the
    all-reduce #1 it waits for it in. The replay used to say "reproduced", rank 0 finished."""
    exact = dict(call(1, 1.0, "started"), algorithm="ring+ring", op="exact_sum")
    d = replay(records({0: {"world": [call(0, 0.0), exact]},
                        1: {"world": [call(0, 0.0), call(1, 1.0, "started")]}}))
    assert not d["reproduced"] and 0 in d["unreplayable"], d
    out = "\n".join(text(d))
    assert "rank 0: stuck, in the records, in allreduce #1 on world (an exact sum" in out, out
    assert "cannot say: rank 0 hangs in the records in calls the replay cannot run" in out, out
    assert "reproduced" not in out.replace("not reproduced", ""), out


def test_one_rank_stalls_and_the_replay_says_what_it_assumed():
    d = replay(records({0: {"world": [call(0, 0.0), call(1, 1.0, "timed out")]},
                        1: {"world": [call(0, 0.0)]}}))
    out = "\n".join(text(d))
    assert d["reproduced"] and "reproduced: rank 0 stalls in the same" in out, out
    assert "assumed: a send of at most 65536 bytes completes before its receive" in out, out
