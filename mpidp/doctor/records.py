"""Reading the flight records of a folder: every file checked whole before any is used.

A record (`mpidp.flight.record`) is untrusted input: the folder may be shared,
hold an earlier job's records, a FIFO, a file cut off or edited by hand. So each
``flight-rank-*.json`` is read by `mpidp.untrusted.read_json` (no blocking, no
link followed, at most `MAX_BYTES`, nesting bounded) and checked against
`RECORD`, a schema of every field the doctor reads, with bounds on every number
it loops over or allocates from (ranks, counts, list lengths), and then against
itself (a member, peer or rank inside its communicator). A refusal is one line
naming the file and the field: `Unreadable`, exit code 2.

The records of one job only are diagnosed: the job (``job`` in each record) of the
newest record. Records of other jobs are set aside with a note that says which, so
an earlier job's record never stands in for a rank of this one.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections import defaultdict

from .. import config
from ..untrusted import (
    Bool,
    Either,
    InputError,
    Int,
    List,
    Num,
    Optional,
    Record,
    Text,
    check,
    read_json,
)

MAX_BYTES = 256 << 20  # as flight.RECORD_MAX_BYTES (the doctor imports no MPI): MBs at most
FOLDER_MAX_BYTES = 1 << 30  # all the records of a folder together: beyond, one line
MAX_WORK = 1 << 24  # the comparisons `unify` makes in all: beyond, one line
MAX_RANKS = 1 << 20  # ranks of a job: the doctor loops over them
MAX_COUNT = 1 << 40  # items in one collective (8 TiB of float64)
STATES = ("planned", "started", "complete", "failed", "timed out", "persistent")


class Unreadable(Exception):
    """The folder holds no readable flight record, or one that is malformed (exit code 2)."""


_rank = Int(0, MAX_RANKS - 1)
_long = Text(1 << 20)  # an exception's text, a reason: shown, never parsed
_items = Int(0, MAX_COUNT)
# a count: the items; per-rank counts (all-gather, reduce-scatter); (count, addends) of
# an exact sum, its count either of those
COUNT = Either((_items, List(Either((_items, List(_items, MAX_RANKS))), MAX_RANKS)))
FRAME = Record({"file": Text(), "line": Optional(Int(0, 1 << 31)), "function": Text(),
                "code": Optional(Text(1 << 16))})
PENDING = Record({"peer": _rank, "kind": Text(choices=("send", "recv")), "known": Bool()},
                 optional=frozenset({"known"}))
CALL = Record({
    "seq": Optional(Int(0, 1 << 62)), "tag": Optional(Int(0, (1 << 31) - 1)),
    "state": Text(choices=STATES), "site": Optional(Text()), "file": Optional(Text()),
    "line": Optional(Int(0, 1 << 31)), "t": Num(), "blocking": Bool(),
    "collective": Text(64), "count": COUNT, "dtype": Text(256), "op": Text(64),
    "algorithm": Text(256), "root": Optional(_rank), "error": _long,
    "round": Optional(Int(0, 1 << 31)), "done": Bool(), "pending": List(PENDING, MAX_RANKS),
}, optional=frozenset({"tag", "site", "file", "line", "blocking", "collective", "count",
                       "dtype", "op", "algorithm", "root", "error", "round", "done",
                       "pending"}))
COMM = Record({"id": Text(256), "how": Text(64), "size": Optional(Int(1, MAX_RANKS)),
               "rank": Optional(_rank), "members": Optional(List(_rank, MAX_RANKS)),
               "parts": List(Optional(Int(0, 1 << 40)), MAX_RANKS),
               "calls": List(CALL, config.FLIGHT_MAX)},
              optional=frozenset({"how", "size", "rank", "members", "parts"}))
THREAD = Record({"name": Text(), "main": Bool(), "dumping": Bool(),
                 "stack": List(FRAME, 1 << 16)}, optional=frozenset({"name", "dumping"}))
RECORD = Record({
    "version": Int(1, 1), "job": Optional(Text(1024)), "rank": _rank,
    "size": Int(1, MAX_RANKS), "host": Optional(Text(1024)), "pid": Optional(Int(0, 1 << 31)),
    "ppid": Optional(Int(0, 1 << 31)), "reason": _long, "time": Num(),
    "keep": Int(0, config.FLIGHT_MAX),
    "comms": List(COMM, 1 << 14), "threads": List(THREAD, 1 << 12),
    "exception": Optional(Record({"type": Text(), "text": _long, "stack": List(FRAME, 1 << 16)})),
}, optional=frozenset({"version", "job", "host", "pid", "ppid", "reason", "time", "keep",
                       "exception"}))


def check_record(rec, where: str) -> dict:
    """`rec` checked against `RECORD` and against itself; InputError naming the field."""
    rec = check(rec, RECORD, where)
    if rec["rank"] >= rec["size"]:
        raise InputError(f"{where}: rank: {rec['rank']} is not below size {rec['size']}")
    for i, c in enumerate(rec["comms"]):
        at, size, members = f"{where}: comms[{i}]", c.get("size"), c.get("members")
        if size is None and (members is not None or c["calls"]):
            raise InputError(f"{at}.size: unknown, for a communicator with members or calls")
        if size is not None and size > rec["size"]:
            raise InputError(f"{at}.size: {size} is more than the job's {rec['size']} ranks")
        if members is not None:
            if len(members) != size or len(set(members)) != size:
                raise InputError(f"{at}.members: not {size} different ranks")
            if max(members) >= rec["size"]:
                raise InputError(f"{at}.members: a rank beyond the job's {rec['size']}")
        parts, rank = c.get("parts"), c.get("rank")
        if parts is not None and (len(parts) != size or members is None or rank is None
                                  or "#" not in c["id"]):
            raise InputError(f"{at}.parts: not one number per member of a communicator "
                             "named at first use (with members, rank and an id g<crc>#...)")
        if rank is not None and size is not None and rank >= size:
            raise InputError(f"{at}.rank: {rank} is not below its size {size}")
        if members is not None and rank is not None and members[rank] != rec["rank"]:
            raise InputError(f"{at}.members: rank {rank} of it is world rank "
                             f"{members[rank]}, not this record's {rec['rank']}")
        for j, k in enumerate(c["calls"]):
            for m, p in enumerate(k.get("pending", [])):
                if p["peer"] >= size:
                    raise InputError(f"{at}.calls[{j}].pending[{m}].peer: {p['peer']} is "
                                     f"not below its communicator's size {size}")
    return rec


def read(folder: str) -> tuple[dict[int, dict], list[str]]:
    """(the records of the folder's newest job, by world rank; notes on what was set aside)."""
    if not os.path.isdir(folder):
        raise Unreadable(f"{folder}: no such folder")
    paths = sorted(glob.glob(os.path.join(glob.escape(folder), "flight-rank-*.json")))
    if not paths:
        raise Unreadable(f"{folder}: no flight record (flight-rank-*.json) in it")
    if len(paths) > MAX_RANKS:
        raise Unreadable(f"{folder}: more than {MAX_RANKS} flight records in it")
    by_job: dict = defaultdict(dict)
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):  # (read_json says what it cannot read)
            total += os.lstat(path).st_size
        if total > FOLDER_MAX_BYTES:
            raise Unreadable(f"{path}: the folder's records pass {FOLDER_MAX_BYTES >> 20} MiB "
                             "together: more than the doctor reads")
        try:
            rec = check_record(read_json(path, MAX_BYTES), path)
        except InputError as e:
            raise Unreadable(f"not a flight record: {e}") from None
        job = rec.get("job")
        if rec["rank"] in by_job[job]:
            raise Unreadable(f"{path}: rank {rec['rank']} twice (also in "
                             f"{by_job[job][rec['rank']][0]}) in job {job}")
        by_job[job][rec["rank"]] = (path, rec)
    newest = max(by_job, key=lambda j: max(r.get("time", 0.0) for _, r in by_job[j].values()))
    notes = []
    for job, recs in sorted(by_job.items(), key=lambda x: str(x[0])):
        if job != newest:
            names = ", ".join(os.path.basename(p) for p, _ in sorted(recs.values()))
            notes.append(f"set aside {len(recs)} record(s) of another, earlier job ({job}): "
                         f"{names}; this is job {newest}")
    if newest is None:
        notes.insert(0, "the records carry no job id (no SLURM, PMIx or Open MPI variable: "
                        "plain mpiexec under MPICH): another run's records are told apart "
                        "by host and launcher (parent) pid only")
        notes[1:1] = _another_run(by_job[None])
    records = {r: rec for r, (_, rec) in by_job[newest].items()}
    sizes = {rec["size"] for rec in records.values()}
    if len(sizes) > 1:
        path = next(p for p, rec in by_job[newest].values() if rec["size"] != max(sizes))
        raise Unreadable(f"{path}: size: the records of job {newest} say {sorted(sizes)} ranks")
    unify(records)
    return records, notes


def _another_run(recs: dict) -> list[str]:
    """Set aside (from `recs`, rank -> (path, record), in place) the records of a host
    whose parent pid (the launcher's proxy: one per host and run) is not that of the
    host's newest record: another run's. The notes that say which."""
    newest: dict = {}
    for _, rec in recs.values():
        host = rec.get("host")
        if rec.get("ppid") is not None and (host not in newest or rec.get("time", 0.0)
                                            > newest[host].get("time", 0.0)):
            newest[host] = rec
    odd = sorted((path, r) for r, (path, rec) in recs.items() if rec.get("ppid") is not None
                 and rec["ppid"] != newest[rec.get("host")]["ppid"])
    for _, r in odd:
        del recs[r]
    if not odd:
        return []
    names = ", ".join(os.path.basename(p) for p, _ in odd)
    return [f"set aside {len(odd)} record(s) of another, earlier run (another launcher "
            f"process on its host): {names}"]


def name_of(key: str, parts: list) -> str:
    """A communicator's id from its members' numbers, as `mpidp.commid.name_of` makes it
    (which the doctor does not import: it starts MPI)."""
    if None not in parts and len(set(parts)) == 1:
        return f"{key}#{parts[0]}"
    return f"{key}#" + "-".join("?" if p is None else str(p) for p in parts)


def unify(records: dict[int, dict]) -> None:
    """Give the records of one communicator named at first use one id (`mpidp.commid`):
    a member whose number had not arrived yet where a record was written holds a ``?``.
    Two ranks' records name the same communicator if their members are the same, their
    known numbers agree, and at least one knows the other's number (it has arrived: a
    member that never used the communicator never sent it). Ids change in place, with
    the duplicates' ids made from them."""
    found = [(r, c) for r, rec in sorted(records.items()) for c in rec["comms"]
             if c.get("parts") is not None]
    group = list(range(len(found)))
    # candidates, not every pair: j can only join i if i knows j's number (or j knows i's,
    # found when j's turn comes), so each i looks up the entries of the ranks whose number
    # it knows, by (key, members, that rank, that number)
    own: dict[tuple, list[int]] = defaultdict(list)
    for i, (_, c) in enumerate(found):
        members = tuple(c["members"])
        own[(c["id"].split("#")[0], members, c["rank"], c["parts"][c["rank"]])].append(i)
    work = 0

    def top(i):
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    for i, (ri, ci) in enumerate(found):
        key, members = ci["id"].split("#")[0], tuple(ci["members"])
        cands = {j for m, p in enumerate(ci["parts"]) if p is not None and m != ci["rank"]
                 for q in (p, None) for j in own.get((key, members, m, q), ())}
        work += len(ci["parts"]) * (len(cands) + 1)
        if work > MAX_WORK:
            raise Unreadable(f"the records name more communicators at first use than the "
                             f"doctor lines up ({len(found)})")
        for j in sorted(cands):
            rj, cj = found[j]
            if ri == rj:
                continue
            pi, pj = ci["parts"], cj["parts"]
            if all(a is None or b is None or a == b for a, b in zip(pi, pj, strict=True)) \
                    and (pi[cj["rank"]] is not None or pj[ci["rank"]] is not None):
                group[top(i)] = top(j)
    merged: dict[int, list] = {}
    for i, (_, c) in enumerate(found):
        parts = merged.setdefault(top(i), [None] * len(c["parts"]))
        for m, p in enumerate(c["parts"]):
            parts[m] = p if p is not None else parts[m]
    for i, (r, c) in enumerate(found):
        old, new = c["id"], name_of(c["id"].split("#")[0], merged[top(i)])
        for other in records[r]["comms"]:  # itself, and its duplicates (old.0, old.1, ...)
            if other["id"] == old or other["id"].startswith(old + "."):
                other["id"] = new + other["id"][len(old):]
