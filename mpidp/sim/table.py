"""Step tables computed by running the code: who sends which block to whom, step by step.

One format for every algorithm. A row per step (one round of an ideal machine,
see `Sim`), a column per rank; a cell lists the rank's messages of that step:

    →q:b    sends block(s) b to rank q          ←q:b   receives block(s) b from rank q
    ↔q:b    sends b to q and receives b from q   →1,2:b  the same to (or from) several ranks

A message is labelled by where its data sits in the sender's vector: a block
number, a range "2-3" of blocks, or "[i:j]" for items that are not whole blocks;
"tmp" is the sender's scratch and "-" an empty message. Every algorithm module's
docstring holds its table for N = 4 under the command that prints it, and
tests/test_sim_engine.py checks that they are equal.
"""

from __future__ import annotations

from .collective import simulate


def default_count(N: int) -> int:
    """Items for a table: four per rank, so every block is whole and no block is empty."""
    return 4 * N


def block_label(blocks, start: int, stop: int) -> str:
    """'3', '2-3' or '[5:9]': items start..stop-1 of a vector cut into `blocks`."""
    if start == stop:
        return "-"
    inside = [i for i in range(len(blocks)) if blocks.counts[i]
              and start <= blocks.displs[i] and blocks.displs[i] + blocks.counts[i] <= stop]
    covered = sum(blocks.counts[i] for i in inside)
    if inside and covered == stop - start and inside == list(range(inside[0], inside[-1] + 1)):
        return str(inside[0]) if len(inside) == 1 else f"{inside[0]}-{inside[-1]}"
    return f"[{start}:{stop}]"


def label(outcome, rank: int, view) -> str:
    """The label of a message that rank `rank` sends from `view`."""
    place = outcome.sim.locate(rank, view)
    if place is None:
        return "?"
    name, start, stop = place
    if name == "tmp":
        return "tmp" if start < stop else "-"
    return block_label(outcome.blocks, start, stop)


def cells(outcome) -> list[list[str]]:
    """cells[step][rank]: the rank's messages in that step, in the table's notation."""
    N, sim = outcome.N, outcome.sim
    rows = [[[[], []] for _ in range(N)] for _ in range(sim.steps)]
    for step, src, dst, sbuf, _, i, j in sim.events:
        text = label(outcome, src, sbuf)
        rows[step][src][0].append((i, dst, text))
        rows[step][dst][1].append((j, src, text))
    return [[_cell([m[1:] for m in sorted(sends)], [m[1:] for m in sorted(recvs)])
             for sends, recvs in row] for row in rows]


def _cell(sends: list, recvs: list) -> str:
    items = []
    recvs = list(recvs)
    for peer, text in sends:  # a send and a receive of the same blocks with one peer: a swap
        swap = (peer, text) in recvs
        if swap:
            recvs.remove((peer, text))
        items.append(("↔" if swap else "→", peer, text))
    items += [("←", peer, text) for peer, text in recvs]
    groups: list = []  # neighbours with the same arrow and blocks share one entry
    for arrow, peer, text in items:
        if groups and groups[-1][0] == arrow and groups[-1][2] == text:
            groups[-1][1].append(peer)
        else:
            groups.append([arrow, [peer], text])
    return " ".join(f"{a}{','.join(map(str, peers))}:{text}" for a, peers, text in groups)


def format_table(grid: list[list[str]], N: int) -> str:
    """The grid as text: `step | rank 0 | rank 1 ...`, columns as wide as their widest cell."""
    width = [max([len(f"rank {r}")] + [len(row[r]) for row in grid]) for r in range(N)]
    head = "step | " + " | ".join(f"rank {r}".ljust(width[r]) for r in range(N))
    rule = "-----+-" + "-+-".join("-" * w for w in width)
    lines = [head.rstrip(), rule]
    for step, row in enumerate(grid):
        lines.append((f"{step:>4} | " + " | ".join(c.ljust(width[r]) for r, c in
                                                    enumerate(row))).rstrip())
    return "\n".join(lines)


def table(algorithm, collective: str = "allreduce", N: int = 4, count: int | None = None,
          root: int = 0, **kw) -> str:
    """The step table of `algorithm` (a name or a generator function), computed by running it."""
    kw.setdefault("max_steps", 8 * N * N + 1000)  # a loop that yields for ever: an error
    outcome = simulate(collective, algorithm, N, default_count(N) if count is None else count,
                       root=root, trace=True, **kw)
    return format_table(cells(outcome), N)


def command(algorithm: str, collective: str = "allreduce", N: int = 4) -> str:
    """The command line that prints a table (what a docstring puts above it)."""
    flag = "" if collective == "allreduce" else f" --collective {collective}"
    return f"$ python -m mpidp.sim table {algorithm}{flag} --ranks {N}"
