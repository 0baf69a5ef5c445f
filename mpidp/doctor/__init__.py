"""The hang doctor: read every rank's flight record (`mpidp.flight`) and say why the job hung.

    python -m mpidp.doctor DIR [--json] [--plot FILE.png] [--replay]

The records are lined up by communicator id and sequence number (the k-th
collective on a communicator is collective #k on every member rank). What it
looks for, in this order, and the cause it names first:

1. the first number where the ranks' calls differ (collective, count, dtype, op,
   algorithm, root): ``different_collective`` (a rank skipped one, or calls them
   in another order) or ``arguments`` (the same collective, other arguments);
2. ranks with no record (killed, or died before they could write one) that others
   wait for: ``killed``;
3. ranks that never reached a collective the others are in, and where their main
   thread is: in another communicator's collective (with a cycle in the waits-for
   graph: ``cycle``), in a blocking point-to-point call of the program's (``p2p``),
   computing or sleeping (``computing``);
4. a rank whose program raised (``exception``).

The waits-for graph has an arrow a -> b when rank a, in a collective in flight,
waits in its current round for a message from (or to) rank b, or waits in a
collective that b has not reached. Its cycles and its roots (ranks waited for
that wait for nobody) are reported.

``--replay`` runs every rank's recorded collectives again in `mpidp.sim`, in one
process, and sets its stalls beside the records' (`mpidp.doctor.replay`).
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter, defaultdict

from .graph import MAX_EDGES, arrows, cycles  # noqa: F401 (MAX_EDGES: its bound)
from .records import Unreadable, read  # noqa: F401 (Unreadable: the doctor's error)

SIG_FIELDS = ("collective", "count", "dtype", "op", "algorithm", "root")
IN_FLIGHT = ("planned", "started", "timed out")
_MPIDP = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FAREWELL = os.path.join(_MPIDP, "farewell.py")  # a rank there has ended its program
_P2P = re.compile(r"\.(I?[Rr]ecv|Sendrecv\w*|[Pp]robe|Mprobe|Wait\w*|[Ss]send|Send|send|wait)\(")


def load(folder: str) -> dict[int, dict]:
    """Every rank's record in `folder` of its newest job, by world rank, each checked whole
    (`records.read`; Unreadable, one line naming the file and field)."""
    return read(folder)[0]


def signature(call: dict) -> tuple:
    return tuple(_hashable(call.get(k)) for k in SIG_FIELDS)


def _hashable(v):
    """`v` with its lists, at any depth, made tuples (an exact sum's count nests them)."""
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def describe(call: dict) -> str:
    """``allreduce(count=8, dtype=float64, op=sum, algorithm=ring)``"""
    args = ", ".join(f"{k}={call[k]}" for k in SIG_FIELDS[1:] if call.get(k) is not None)
    return f"{call.get('collective', '?')}({args})"


def short(site: str | None) -> str:
    """A call site relative to the working folder when it is under it."""
    if not site:
        return "?"
    path, _, line = site.rpartition(":")
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path if rel.startswith('..') else rel}:{line}"


def verb(ranks, one: str, many: str) -> str:
    """The verb that agrees with `ranks_text(ranks)`: ``rank 1 stalls``, ``ranks 1, 2 stall``."""
    return one if len(set(ranks)) == 1 else many


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class Comm:
    """One communicator as the records show it: its members and each rank's calls."""

    def __init__(self, cid: str):
        self.id = cid
        self.members: list[int] | None = None
        self.calls: dict[int, dict[int, dict]] = {}  # world rank -> seq -> call
        self.local: dict[int, int] = {}  # world rank -> its rank in this comm
        self._reached: dict[int, int] | None = None
        self._by_reached: list[tuple[int, int]] | None = None

    def world(self, local_rank: int) -> int:
        if self.members and local_rank < len(self.members):
            return self.members[local_rank]
        return local_rank  # (members that disagree across ranks are noted in `_comms`)

    def reached(self, rank: int) -> int:
        """The highest number `rank` has called (-1: none recorded), worked out once."""
        if self._reached is None:
            self._reached = {r: max(calls, default=-1) for r, calls in self.calls.items()}
        return self._reached.get(rank, -1)

    def short_of(self, seq: int, records) -> list[int]:
        """The members that have not reached `seq` (or left no record), in rank order:
        found by bisection over the members sorted by how far they got, once."""
        if self._by_reached is None:
            self._by_reached = sorted((self.reached(b) if b in records else -1, b)
                                      for b in self.members or [])
        return sorted(b for _, b in self._by_reached[:bisect.bisect_left(
            self._by_reached, (seq, -1))])


def _comms(records: dict[int, dict]) -> tuple[dict[str, Comm], list[str]]:
    comms: dict[str, Comm] = {}
    notes = []
    for rank, rec in records.items():
        for c in rec["comms"]:
            comm = comms.setdefault(c["id"], Comm(c["id"]))
            if c.get("members") is not None:
                if comm.members is not None and comm.members != c["members"]:
                    notes.append(f"communicator {c['id']}: rank {rank} has members "
                                 f"{c['members']}, another rank {comm.members} (ids disagree)")
                comm.members = comm.members or c["members"]
            comm.local[rank] = c.get("rank")
            for k in c["calls"]:
                k["site"] = short(k.get("site"))
            comm.calls[rank] = {k["seq"]: k for k in c["calls"] if k.get("seq") is not None}
    return comms, notes


def where(rec: dict) -> dict:
    """What a rank's main thread is doing, from its stack: in a collective of mpidp's,
    in a blocking point-to-point call of the program's, or computing (sleeping)."""
    threads = [t for t in rec["threads"] if t.get("main")] or rec["threads"][:1]
    stack = threads[0]["stack"] if threads else []
    if rec.get("exception") and rec["exception"]["stack"]:  # where it was, not the abort
        stack = rec["exception"]["stack"]
    if not stack:
        return {"kind": "unknown", "text": "no stack recorded"}
    if any(f["file"] == _FAREWELL and f["function"] == "leave" for f in stack):
        return {"kind": "finished", "text": "finished: its program ended, and it waits for "
                "the others' goodbyes, in no collective"}
    user = [f for f in stack if not f["file"].startswith(_MPIDP) and "runpy" not in f["file"]
            and not f["file"].endswith(os.path.join("mpi4py", "run.py"))]
    top = user[-1] if user else stack[-1]
    site = short(f"{top['file']}:{top['line']}")
    inner = stack[stack.index(top) + 1:] if top in stack else []
    if any(os.sep + "collectives" + os.sep in f["file"] for f in inner):
        return {"kind": "collective", "site": site, "code": top["code"],
                "text": f"in a collective of mpidp's called at {site} ({top['code']})"}
    if _P2P.search(top["code"] or ""):
        return {"kind": "p2p", "site": site, "code": top["code"],
                "text": f"in a blocking point-to-point call of its own at {site} "
                        f"({top['code']})"}
    how = "sleeping" if "sleep(" in (top["code"] or "") else "computing"
    return {"kind": "computing", "site": site, "code": top["code"],
            "text": f"{how} at {site} ({top['code'] or top['function']}), in no collective"}


def _in_flight(records) -> list[dict]:
    """Every call in flight on every rank, with its communicator."""
    out = []
    for rank, rec in sorted(records.items()):
        for c in rec["comms"]:
            for call in c["calls"]:
                if call.get("state") in IN_FLIGHT:
                    out.append({**call, "rank": rank, "comm": c["id"]})  # (ours override its own)
    return out


def _first_difference(comm: Comm, records) -> dict | None:
    """The first number on `comm` where the ranks' calls differ, or where some ranks wait
    in a collective others never reached."""
    present = [r for r in (comm.members or sorted(comm.calls)) if r in records]
    at: dict[int, dict[int, dict]] = defaultdict(dict)  # seq -> rank -> call: built once
    for r in present:
        for s, call in comm.calls.get(r, {}).items():
            at[s][r] = call
    lowest = min((comm.reached(r) for r in present), default=-1)
    for s in sorted(at):
        have = dict(sorted(at[s].items()))
        groups = defaultdict(list)
        for r, call in have.items():
            groups[signature(call)].append(r)
        waiting = [r for r, call in have.items() if call.get("state") in IN_FLIGHT]
        if len(groups) > 1 or (lowest < s and waiting):
            behind = [r for r in present if comm.reached(r) < s]
            return {"comm": comm.id, "seq": s, "behind": behind, "waiting": waiting,
                    "groups": [{"ranks": rs, "call": describe(have[rs[0]]),
                                # (a call that raised before its signature has none)
                                "collective": have[rs[0]].get("collective") or "?",
                                "sites": sorted({have[r]["site"] for r in rs}),
                                "states": sorted({have[r]["state"] for r in rs})}
                               for rs in sorted(groups.values(), key=lambda g: (-len(g), g))]}
    return None


def diagnose(records: dict[int, dict], warnings: list[str] | None = None) -> dict:
    """The diagnosis as data: the cause first, then the evidence. `warnings`: what reading
    the folder set aside (another job's records), printed above the cause."""
    size = max(rec["size"] for rec in records.values())
    missing = [r for r in range(size) if r not in records]
    jobs = sorted({str(rec.get("job")) for rec in records.values()})
    comms, notes = _comms(records)
    if len(jobs) > 1:
        notes.append(f"the records come from different jobs: {', '.join(jobs)}")
    flight = _in_flight(records)
    edges = arrows(records, comms, flight)
    nodes = set(range(size))
    found = cycles(nodes, edges)
    waiting_on = Counter(e["to"] for e in edges)
    out_of = {e["from"] for e in edges}
    roots = sorted(b for b in waiting_on if b not in out_of)
    first = [d for d in (_first_difference(c, records) for c in comms.values()) if d]
    first.sort(key=lambda d: (d["comm"] != "world", d["seq"]))
    wheres = {r: where(rec) for r, rec in records.items()}
    failed = {r: [c for c in rec["comms"] for c in c["calls"] if c.get("state") == "failed"
                  and not c.get("error", "").startswith("TimeoutError")]
              for r, rec in records.items()}
    raised = {r: rec["reason"] for r, rec in records.items()
              if "failed:" in rec.get("reason", "") and "TimeoutError" not in rec["reason"]}
    d = {"size": size, "records": sorted(records), "missing": missing, "jobs": jobs,
         "first_difference": first[0] if first else None, "differences": first,
         "in_flight": flight, "edges": edges, "cycles": found, "roots": roots,
         "where": wheres, "raised": raised, "notes": notes, "warnings": list(warnings or [])}
    d["cause"] = _cause(d, comms, failed)
    return d


def _cause(d, comms, failed) -> dict:
    first = d["first_difference"]
    if first and len(first["groups"]) > 1:
        main, *odd = first["groups"]
        site = main["sites"][0]
        oddr = sorted(r for g in odd for r in g["ranks"])
        if all(g["collective"] == main["collective"] for g in odd):
            kind = "arguments"
            text = (f"{ranks_text(oddr)} called {main['collective']} #{first['seq']} on "
                    f"{first['comm']} with other arguments than {ranks_text(main['ranks'])} "
                    f"({'; '.join(g['call'] + ' at ' + g['sites'][0] for g in odd)} vs "
                    f"{main['call']} at {site})")
        else:
            kind = "different_collective"
            text = (f"{ranks_text(oddr)} called "
                    f"{' / '.join(g['collective'] + ' at ' + g['sites'][0] for g in odd)} as "
                    f"collective #{first['seq']} on {first['comm']}, where "
                    f"{ranks_text(main['ranks'])} called {main['collective']} at {site}"
                    + (f" and {verb(main['ranks'], 'waits', 'wait')} in it"
                       if set(main["states"]) & set(IN_FLIGHT) else "") + ": "
                    f"{'it' if len(oddr) == 1 else 'they'} skipped that {main['collective']}, "
                    "or the ranks call collectives in different orders")
        return {"kind": kind, "ranks": oddr, "comm": first["comm"], "seq": first["seq"],
                "site": site, "text": text}
    waited = {e["to"] for e in d["edges"]}
    dead = [r for r in d["missing"] if r in waited] or d["missing"]
    if dead:
        dead_set = set(dead)
        ws = [e for e in d["edges"] if e["to"] in dead_set]
        e = ws[0] if ws else None
        text = (f"{ranks_text(dead)} left no record (killed, or died before writing one)"
                + (f"; {ranks_text({x['from'] for x in ws})} "
                   f"{verb({x['from'] for x in ws}, 'waits', 'wait')} for "
                   f"{'it' if len(dead) == 1 else 'them'} in {e['label']}" if e else ""))
        return {"kind": "killed", "ranks": dead, "comm": e and e["comm"],
                "seq": e and e["seq"], "site": None, "text": text}
    if d["raised"]:
        r = min(d["raised"])
        site = d["where"][r].get("site")
        return {"kind": "exception", "ranks": sorted(d["raised"]), "comm": None, "seq": None,
                "site": site, "text": f"rank {r} raised at {site}: {d['raised'][r]}"}
    if first and first["behind"]:
        behind = first["behind"]
        kinds = {r: d["where"][r]["kind"] for r in behind}
        waiting = first["waiting"]
        call = first["groups"][0] if first["groups"] else None
        what = (f"{call['collective']} #{first['seq']} on {first['comm']} (at "
                f"{call['sites'][0]})" if call else f"#{first['seq']} on {first['comm']}")
        r = behind[0]
        if d["cycles"] and any(r in c for c in d["cycles"]) and kinds[r] == "collective":
            kind = "cycle"
            cyc = " -> ".join(map(str, d["cycles"][0] + d["cycles"][0][:1]))
            text = (f"{ranks_text(behind)} never reached {what}, which {ranks_text(waiting)} "
                    f"{verb(waiting, 'waits', 'wait')} in: rank {r} is "
                    f"{d['where'][r]['text']}, and the ranks wait for each other in a cycle "
                    f"({cyc}): they call collectives on different communicators in different "
                    "orders")
        else:
            kind = {"collective": "other_collective", "p2p": "p2p",
                    "finished": "finished"}.get(kinds[r], "computing")
            text = (f"{ranks_text(behind)} never reached {what}, which "
                    f"{ranks_text(waiting)} {verb(waiting, 'waits', 'wait')} in: rank {r} is "
                    f"{d['where'][r]['text']}")
        return {"kind": kind, "ranks": behind, "comm": first["comm"], "seq": first["seq"],
                "site": d["where"][r].get("site"), "text": text}
    if any(failed.values()):
        r = min(r for r, v in failed.items() if v)
        c = failed[r][0]
        return {"kind": "exception", "ranks": [r], "comm": None, "seq": c.get("seq"),
                "site": c["site"], "text": f"rank {r}: {describe(c)} at {c['site']} "
                f"failed: {c.get('error', 'no error recorded')}"}
    if not d["in_flight"]:
        return {"kind": "no_hang", "ranks": [], "comm": None, "seq": None, "site": None,
                "text": "no collective is in flight on any rank: the records show no hang"}
    return {"kind": "unknown", "ranks": [], "comm": None, "seq": None, "site": None,
            "text": "collectives are in flight, but the records agree: a slow link or peer?"}
