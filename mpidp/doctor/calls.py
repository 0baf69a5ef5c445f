"""The calls of the ranks' flight records, lined up: the doctor's vocabulary.

A call's signature and description, a site made short, ranks said in words, a
communicator as the records show it (`Comm`: its members and each rank's calls by
number), and where a rank's main thread is (`where`).
"""

from __future__ import annotations

import bisect
import os
import re

SIG_FIELDS = ("collective", "count", "dtype", "op", "algorithm", "root")
IN_FLIGHT = ("planned", "started", "timed out")
_MPIDP = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FAREWELL = os.path.join(_MPIDP, "farewell.py")  # a rank there has ended its program
_P2P = re.compile(r"\.(I?[Rr]ecv|Sendrecv\w*|[Pp]robe|Mprobe|Wait\w*|[Ss]send|Send|send|wait)\(")



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
