"""The article's numbers at any scale: bytes each rank sends and receives, measured by simulation.

    python -m mpidp.sim volume --ranks 2,4,8,16,32,64,128,256,512,1024

prints, for every all-reduce algorithm, the bytes one rank sends and receives
as multiples of G (the vector's bytes), counted by the simulator while the
unchanged code runs: the ring's 2(N-1)/N tends to 2, direct's N-1 grows.
"""

from __future__ import annotations

import math

from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.fold import fold

from . import symmetry as symmetry_mod
from .collective import names, resolve, simulate

FULL_UP_TO = 1024  # ranks: the largest N simulated whole when there is no symmetry to use

NOTE = """\
The article's D = D_send + D_recv = 2·G·(N-1)/N adds what one rank moves in the
reduce-scatter, G(N-1)/N, and in the all-gather, G(N-1)/N: that is the ring's
"sent" column, and the rank receives as much again ("recv"). The article's first
estimate, 2·G·(N-1), is direct's sent plus received: G(N-1) each way. So per rank
and per direction the ring moves 2(N-1)/N·G, below 2G at any N, and direct
(N-1)·G, N/2 times more. Rabenseifner moves what the ring moves in 2·log2 N
rounds instead of 2(N-1); recursive doubling and naive send G·log2 N (naive: the
root; * marks an algorithm whose ranks differ, the column shows the most)."""


def count_for(collective: str, algorithm, N: int) -> int:
    """A count that splits into whole blocks for N and for the power of two below it.

    An algorithm whose scratch grows with N (direct: a vector per rank) sends whole
    vectors, and its bytes are a multiple of G at any count: it gets 2 items.
    """
    q = fold(N)[0]  # the largest power of two <= N
    count = 2 * N * q // math.gcd(N, q)
    _, scratch, _ = resolve(collective, algorithm)
    if scratch is not None and scratch(Blocks.even(count, N)) > 2 * count:
        return 2
    return count


def measure(collective: str, algorithm, N: int, placement=None,
            symmetry: bool | None = None) -> dict:
    """Bytes sent and received per rank (most and least over the ranks), as multiples of G;
    with a `placement` (the host of each rank), also the bytes through the busiest host
    link in its busier direction ("link"). `symmetry`: from host 0's ranks alone
    (`symmetry.by_symmetry`, where the schedule allows it); None: so past 256 ranks."""
    ppn = symmetry_mod.equal_hosts(placement, N)
    if symmetry is None:
        symmetry = N > 256 and ppn is not None and isinstance(algorithm, str) and \
            symmetry_mod.symmetric(collective, algorithm, N, ppn)
    if symmetry:
        return from_schedule(symmetry_mod.by_symmetry(collective, algorithm, N, ppn),
                             placement is not None)
    count = count_for(collective, algorithm, N)
    out = simulate(collective, algorithm, N, count, dtype="uint8", placement=placement,
                   data=False)  # bytes are counted, not moved: the schedules ignore the data
    s, G = out.sim, float(count)
    row = {"N": N, "algorithm": out.name, "steps": s.steps,
           "sent": max(s.bytes_sent) / G, "sent_min": min(s.bytes_sent) / G,
           "recv": max(s.bytes_received) / G, "recv_min": min(s.bytes_received) / G}
    if placement is not None:
        row["link"] = max(link_bytes(s, placement)) / G
    return row


def from_schedule(sched, link: bool) -> dict:
    """`measure`'s row from a `symmetry.Schedule` (its G: the schedule's float32 bytes)."""
    G = float(sched.count * symmetry_mod.ITEM)
    row = {"N": sched.N, "algorithm": sched.algorithm, "steps": len(sched.steps),
           "sent": sched.sent[1] / G, "sent_min": sched.sent[0] / G,
           "recv": sched.received[1] / G, "recv_min": sched.received[0] / G}
    if link:
        row["link"] = sched.link / G
    return row


def link_bytes(sim, placement) -> list[int]:
    """Bytes through each host's link, out then in: [out of host 0, into host 0, out of 1, ...]."""
    H = max(placement) + 1
    through = [0] * (2 * H)
    for (a, b), nbytes in sim.links.items():
        if placement[a] != placement[b]:
            through[2 * placement[a]] += nbytes
            through[2 * placement[b] + 1] += nbytes
    return through


def volume(ranks, collective: str = "allreduce", algorithms=None, placement=None) -> list[dict]:
    """`measure` for every algorithm (mpidp's, by default) and every N in `ranks`;
    `placement`: a function of N giving the host of each rank (None: one host). Past
    `FULL_UP_TO` ranks only the algorithms with a symmetry (`symmetry.symmetric`) run."""
    rows = []
    for N in ranks:
        where = placement and placement(N)
        ppn = symmetry_mod.equal_hosts(where, N)
        for a in algorithms or names(collective):
            if N > FULL_UP_TO and not (ppn is not None and isinstance(a, str) and
                                       symmetry_mod.symmetric(collective, a, N, ppn)):
                continue  # no symmetry to use, and the whole run would take minutes: left blank
            rows.append(measure(collective, a, N, where))
    return rows


def format_volume(rows: list[dict]) -> str:
    """One line per N: sent / recv per rank for each algorithm, in multiples of G."""
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    differs = {r["algorithm"] for r in rows if r["sent_min"] != r["sent"]
               or r["recv_min"] != r["recv"]}
    heads = [a + ("*" if a in differs else "") for a in algorithms]
    width = [max(len(h), 15) for h in heads]
    link = all("link" in r for r in rows)
    lines = ["bytes per rank, sent / received, as multiples of G (simulated)"
             + ("; / the busiest host link, per direction" if link else ""),
             "     N | " + " | ".join(h.ljust(w) for h, w in zip(heads, width, strict=True))]
    lines.append("-" * 7 + "+" + "+".join("-" * (w + 2) for w in width))
    by = {(r["N"], r["algorithm"]): r for r in rows}
    for N in dict.fromkeys(r["N"] for r in rows):
        cells = [f"{by[N, a]['sent']:.3f} / {by[N, a]['recv']:.3f}"
                 + (f" / {by[N, a]['link']:.3f}" if link else "") if (N, a) in by else ""
                 for a in algorithms]
        lines.append(f"{N:>6} | " + " | ".join(c.ljust(w) for c, w in
                                                 zip(cells, width, strict=True)))
    return "\n".join(line.rstrip() for line in lines)
