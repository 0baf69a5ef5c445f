"""``--replay``: every rank's recorded collectives run again in `mpidp.sim`, in one process.

Each rank's program is the collectives its record holds, on every communicator,
in the order it called them (the time of each call), each with what the record
says: the collective, count, dtype, op, algorithm (the one ``auto`` picked),
root, the communicator's members, the tag the runtime formed (the call's slot
in its communicator's sequence with its signature folded in), and whether the
call blocked. `mpidp.sim.sequence.run_sequences` runs them with the unchanged
algorithms, a message matching only one with the same communicator, peer and
tag; a rank stalls where nothing it waits for can come. Then the replay's
stalls are set beside the records': the same ranks stuck in the same
collectives and rounds is the hang reproduced, deterministically, without MPI.

What it reproduces: hangs that come of the collectives themselves, their order
on each rank (a skipped call, two calls or two communicators in other orders)
and their arguments (another count, dtype, op, root or algorithm: other tags,
so no match). What it cannot: what a rank did outside mpidp's collectives (its
own compute, sleep, point-to-point calls, an exception): that rank shows as one
that finished its recorded collectives, and the others stall waiting for it, as
they did. Nor a rank with no record (killed), collectives that fell out of the
record (only the last ``MPIDP_FLIGHT`` are kept: the replay starts where every
rank still has them), persistent collectives (one entry for all their starts),
exact and ordered sums (their passes are one entry): those calls are left out,
and said so; a rank stuck in one of them is said to be, and the replay then claims
nothing about the hang ("cannot say"). Nor records it cannot afford or read: more
than `REPLAY_MAX_BYTES` of buffers in all, a dtype not in `REPLAY_DTYPES`, a
count of the wrong shape: one line says which call.
"""

from __future__ import annotations

import numpy as np

from mpidp.sim.collective import COLLECTIVES, names, rounds_of
from mpidp.sim.engine import SimComm
from mpidp.sim.reports import ScheduleError
from mpidp.sim.sequence import EAGER, Collective, run_sequences

from .calls import IN_FLIGHT, ranks_text, verb

CAN = ("it reproduces hangs that come of the collectives' order and arguments; not a rank "
       "stuck in its own compute or point-to-point (that rank shows as one that finished "
       "its recorded collectives, the others waiting for it)")


# The replay does not know the MPI library's eager limit (it differs by library, transport
# and settings; the mpich wheel kept an 11 KB send pending): it says what it took.
ASSUMED = (f"assumed: a send of at most {EAGER} bytes completes before its receive is "
           "posted (eager), a larger one only once it is matched; an MPI library with a "
           "lower limit stalls sends this replay lets through")

# what the replay allocates: a buffer and scratch per call, on every rank (np.zeros)
REPLAY_MAX_BYTES = 1 << 30
REPLAY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64", "complex64", "complex128")
EXACT_OPS = ("exact_sum", "exact_avg")
ORDERED_OPS = ("ordered_sum", "ordered_avg")  # the ordered sums of parts (ordered.py)


def _replayable(call: dict) -> str | None:
    """Why `call` cannot be replayed (None: it can): what the replay does not run."""
    if call.get("state") == "persistent":
        return "a persistent collective (one entry for all its starts)"
    name, algo = call.get("collective"), call.get("algorithm")
    if name is None or call.get("tag") is None:
        return None if call.get("state") == "failed" else "no signature recorded"
    if call.get("op") in ORDERED_OPS:
        return "an ordered sum of parts (its exchange and all-gather are one entry)"
    if call.get("op") in EXACT_OPS or "+" in str(algo):
        return "an exact sum (its two passes are one entry)"
    if name not in COLLECTIVES or algo not in names(name):
        return f"algorithm {algo!r} of {name} is not one the simulator runs alone"
    return None


def _malformed(call: dict, size: int) -> str | None:
    """What in a replayable-looking `call` the replay cannot take (None: nothing)."""
    name = call["collective"]
    if call.get("dtype", "float64") not in REPLAY_DTYPES:
        return (f"dtype {call.get('dtype')!r} is not one the replay takes "
                f"({', '.join(REPLAY_DTYPES)})")
    count = call.get("count")
    if count is None:
        return "no count recorded"
    blocks = name in ("allgather", "reduce_scatter")
    if blocks != isinstance(count, list) or blocks and (
            len(count) != size or not all(isinstance(c, int) for c in count)):
        return (f"count {count!r} is not what {name} takes "
                + ("(one per rank)" if blocks else "(a number of items)"))
    if call.get("root") is not None and size is not None and call["root"] >= size:
        return f"root {call['root']} is not a rank of its communicator"
    return None


def _bytes(call: dict) -> int:
    """What replaying `call` allocates on one rank: its buffer and as much scratch."""
    count = call["count"]
    items = sum(count) if isinstance(count, list) else count
    return 2 * items * np.dtype(call.get("dtype", "float64")).itemsize


def programs(records: dict[int, dict]) -> tuple[list, list[str], list[str], dict]:
    """(each rank's list of `Collective`, notes, why the replay cannot be run: [] if it can,
    rank -> the call in flight on it that the replay cannot run)."""
    size = max(rec["size"] for rec in records.values())
    missing = [r for r in range(size) if r not in records]
    if missing:
        return [], [], [f"{ranks_text(missing)} left no record: what "
                        f"{'it' if len(missing) == 1 else 'they'} called is not known"], {}
    hosts: dict = {}
    placement = tuple(hosts.setdefault(records[r].get("host"), len(hosts)) for r in range(size))
    # where every member still has its calls: the last MPIDP_FLIGHT are kept
    start: dict[str, int] = {}
    for rec in records.values():
        for c in rec["comms"]:
            seqs = [k["seq"] for k in c["calls"] if k.get("seq") is not None]
            if seqs:
                start[c["id"]] = max(start.get(c["id"], 0), min(seqs))
    notes = [f"{cid}: replayed from #{s} on (the records keep the last calls only; the ones "
             "before are taken as complete)" for cid, s in sorted(start.items()) if s > 0]
    progs, left_out, stuck, total = [], [], {}, 0
    for r in range(size):
        calls = []
        for c in records[r]["comms"]:
            if c.get("size") is None or c.get("rank") is None:
                continue  # (no calls: `records.check_record`) a comm-like's, unknown
            members = tuple(c["members"]) if c.get("members") else tuple(range(c["size"]))
            sub = tuple(placement[m] if m < size else 0 for m in members)
            for k in c["calls"]:
                if k.get("seq") is None and k.get("state") == "complete":
                    continue  # not one of mpidp's (the placement query): nothing to replay
                if k.get("seq") is None and start.get(c["id"], 0) > 0 or \
                        k.get("seq") is not None and k["seq"] < start.get(c["id"], 0):
                    continue
                why = _replayable(k)
                if why is not None:
                    what = f"{k.get('collective', '?')} #{k.get('seq')} on {c['id']}"
                    left_out.append(f"rank {r}: {what}: {why}")
                    if k.get("state") in IN_FLIGHT:
                        stuck.setdefault(r, f"{what} ({why})")
                    continue
                if k.get("collective") is None:  # it raised before it had a signature
                    continue
                bad = _malformed(k, c["size"])
                if bad is not None:
                    return [], [], [f"rank {r}: {k['collective']} #{k.get('seq')} on "
                                    f"{c['id']}: {bad}"], {}
                total += _bytes(k)
                if total > REPLAY_MAX_BYTES:
                    return [], [], [f"rank {r}: {k['collective']} #{k.get('seq')} on {c['id']}"
                                    f" brings the replay's buffers to {total} bytes, more "
                                    f"than the {REPLAY_MAX_BYTES} it may allocate"], {}
                comm = SimComm(c["rank"], c["size"])
                gen = rounds_of(k["collective"], k["algorithm"], comm, k["count"],
                                k.get("dtype", "float64"), k.get("op") or "sum",
                                k.get("root") or 0, sub if len(set(sub)) > 1 else None)
                calls.append((k["t"], k.get("seq") or 0, Collective(
                    gen, k["tag"], c["id"], members, k.get("blocking", True), (c["id"], k))))
        calls.sort(key=lambda x: x[:2])
        progs.append([x[2] for x in calls])
    persistent = [x for x in left_out if "persistent" in x]
    if persistent:  # its starts are not recorded: where they come in each program is unknown
        return [], [], [f"{persistent[0]}, and {len(persistent) - 1} more" if
                        len(persistent) > 1 else persistent[0]], {}
    if left_out:
        notes.append("left out: " + "; ".join(left_out[:6])
                     + (f"; and {len(left_out) - 6} more" if len(left_out) > 6 else ""))
    return progs, notes, [], stuck


def _live(records) -> dict[int, set]:
    """rank -> {(comm, seq, round)} of the collectives in flight in its record."""
    out: dict[int, set] = {}
    for r, rec in records.items():
        for c in rec["comms"]:
            for k in c["calls"]:
                if k.get("state") in IN_FLIGHT and _replayable(k) is None:
                    out.setdefault(r, set()).add((c["id"], k.get("seq"), k.get("round")))
    return out


def replay(records: dict[int, dict]) -> dict:
    """The replay as data: each rank's stalls, beside its record's, and whether they agree."""
    try:
        progs, notes, cannot, stuck = programs(records)
    except ValueError as e:  # an op or algorithm the records name that mpidp does not know
        progs, notes, cannot, stuck = [], [], [" ".join(str(e).split())], {}
    size = max(rec["size"] for rec in records.values())
    d = {"can": CAN, "notes": notes, "ranks": {}, "reproduced": False, "unreplayable": stuck}
    if cannot:
        d["error"] = "cannot replay: " + "; ".join(cannot)
        return d
    try:
        run = run_sequences(progs)
    except (ScheduleError, ValueError, TypeError, IndexError) as e:  # records that disagree
        d["error"] = "the replay stopped: " + " ".join(str(e).split())
        return d
    live = _live(records)
    same = True
    for r in range(size):
        mine = [{"comm": s.label[0], "seq": s.label[1].get("seq"),
                 "collective": s.label[1].get("collective"), "site": s.label[1].get("site"),
                 "round": s.round, "blocking": s.label[1].get("blocking", True),
                 "pending": [{"kind": p.kind, "peer": p.world} for p in s.pending]}
                for s in run.stalls.get(r, [])]
        got = {(s["comm"], s["seq"], s["round"]) for s in mine}
        want = live.get(r, set())
        # a live round the dump could not read (None) matches any
        agree = {(c, q) for c, q, _ in got} == {(c, q) for c, q, _ in want} and all(
            rnd is None or (c, q, rnd) in got for c, q, rnd in want)
        same &= agree
        d["ranks"][r] = {"stalls": mine, "calls": run.lengths[r], "agrees": agree,
                         "recorded": sorted([list(x) for x in want], key=str)}
    d["stalled"], d["finished"] = run.stalled, run.finished
    # a rank stuck in a call left out: its stall is not the replay's to reproduce or not
    d["reproduced"] = same and bool(run.stalled) and not stuck
    return d


def text(d: dict) -> list[str]:
    """The replay as the doctor prints it."""
    out = ["replay (mpidp.sim: every rank's recorded collectives in one process, no MPI, "
           "with the runtime's tags):"]
    if "error" in d:
        return out + [f"  {d['error']}", f"  ({d['can']})"]
    stuck = d.get("unreplayable", {})
    for r, x in sorted(d["ranks"].items()):
        line = f"  rank {r}: " + ("; ".join(map(_stall, x["stalls"])) or (
            f"stuck, in the records, in {stuck[r]}: a call the replay cannot run" if r in stuck
            else f"finished its {x['calls']} recorded collective(s)"))
        if not x["agrees"]:
            line += "  <- the record differs: " + (", ".join(
                f"{c} #{q} round {rnd}" for c, q, rnd in x["recorded"]) or "in no collective")
        out.append(line)
    if stuck:
        out.append(f"  cannot say: {ranks_text(stuck)} "
                   f"{'hangs' if len(stuck) == 1 else 'hang'} in the records in calls the "
                   "replay cannot run; what it replayed of the others is above")
    elif d["reproduced"]:
        out.append(f"  reproduced: {ranks_text(d['stalled'])} "
                   f"{verb(d['stalled'], 'stalls', 'stall')} in the same collectives "
                   "and rounds as in the records")
    elif not d["stalled"]:
        out.append("  not reproduced: every recorded collective completes in the replay "
                   "(the hang is outside them, or in what the records left out)")
    else:
        out.append("  not reproduced exactly: the replay's stalls differ from the records'")
    out += [f"  note: {n}" for n in d["notes"]]
    out.append(f"  ({ASSUMED})")
    out.append(f"  ({d['can']})")
    return out


def _stall(s: dict) -> str:
    waits = ", ".join(f"{p['kind']} {'from' if p['kind'] == 'recv' else 'to'} {p['peer']}"
                      for p in s["pending"])
    return (f"stalls in {s['collective']} #{s['seq']} on {s['comm']} round {s['round']}"
            + (f" ({waits})" if waits else ""))
