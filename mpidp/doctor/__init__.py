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

from collections import Counter, defaultdict

from .calls import (  # noqa: F401 (the doctor's vocabulary, as mpidp.doctor's names)
    IN_FLIGHT,
    SIG_FIELDS,
    Comm,
    _comms,
    describe,
    ranks_text,
    short,
    signature,
    verb,
    where,
)
from .graph import MAX_EDGES, arrows, cycles  # noqa: F401 (MAX_EDGES: its bound)
from .records import Unreadable, read  # noqa: F401 (Unreadable: the doctor's error)


def load(folder: str) -> dict[int, dict]:
    """Every rank's record in `folder` of its newest job, by world rank, each checked whole
    (`records.read`; Unreadable, one line naming the file and field)."""
    return read(folder)[0]


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
