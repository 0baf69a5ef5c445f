"""The waits-for graph of the doctor: its arrows (a rank waiting for another, in a
collective's round or for a member that has not reached it) and the cycles in it."""

from __future__ import annotations

from collections import defaultdict

from .records import Unreadable

# the most waits-for arrows the doctor draws: beyond, one line (a record within the schema's
# bounds may claim 2^20 members waiting in each of 2^16 calls: 2^36 arrows)
MAX_EDGES = 1 << 21


def arrows(records, comms, flight) -> list[dict]:
    """The waits-for arrows; Unreadable beyond `MAX_EDGES` of them."""
    edges = []
    for call in flight:
        if len(edges) > MAX_EDGES:
            raise Unreadable(f"the records' calls in flight wait for more than {MAX_EDGES} "
                             "ranks in all: more than the doctor draws")
        comm = comms[call["comm"]]
        a, label = call["rank"], f"{call.get('collective', '?')} #{call['seq']}"
        if call["comm"] != "world":
            label += f" on {call['comm']}"
        if "pending" in call:
            rnd = call.get("round")
            for m in call["pending"]:
                b = comm.world(m["peer"])
                edges.append({"from": a, "to": b, "comm": call["comm"], "seq": call["seq"],
                              "round": rnd, "kind": m["kind"],
                              "label": f"{label} round {rnd}"})
        else:  # no round known: it waits for every member that has not reached it
            for b in comm.short_of(call["seq"] or 0, records):
                if b != a:
                    edges.append({"from": a, "to": b, "comm": call["comm"], "seq": call["seq"],
                                  "round": None, "kind": "not reached",
                                  "label": f"{label} (not reached)"})
    seen, unique = set(), []
    for e in edges:
        key = (e["from"], e["to"], e["label"])
        if key not in seen:
            seen.add(key)
            unique.append(e)
    return unique


def cycles(nodes, edges) -> list[list[int]]:
    """A cycle of waits in each strongly connected part with more than one rank (Tarjan's,
    without recursion: a chain of thousands of waits is a chain of records), each the
    ranks in the order the waits go, every step an edge: a -> b -> ... -> a."""
    succ = defaultdict(set)
    for e in edges:
        succ[e["from"]].add(e["to"])
    index, low, stack, on, parts = {}, {}, [], set(), []
    for root in sorted(nodes):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        work = [(root, iter(sorted(succ[root])))]
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.add(w)
                    if w == v:
                        break
                if len(part) > 1 or v in succ[v]:
                    parts.append(part)
    return sorted((cycle_in(part, succ) for part in parts), key=lambda c: c[0])


def cycle_in(part: set, succ) -> list[int]:
    """The shortest cycle through the part's lowest rank, along its edges (breadth first)."""
    start = min(part)
    came: dict[int, int] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(succ[v] & part):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return path[::-1]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]  # (not reached: the part is strongly connected)
