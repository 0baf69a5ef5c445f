"""Scale by simulation: each algorithm's time for any N, from α, β, γ and an optional topology.

    python -m mpidp.sim predict --collective allreduce --ranks 4,64,1024 --bytes 8,1MiB \\
        --calibration docs/bench/calibrate-n4.txt [--ppn 8 --alpha-inter 5e-6 --beta-inter 1e-10]

`Timer` times a simulated schedule message by message: a message starts when
both its rounds are posted and the sender's send port and the receiver's receive
port are free, and takes α + bytes·β (each rank sends one message at a time and
receives one at a time); a round ends with its last message; the reductions that
follow cost γ per byte. With ``ppn`` ranks per node, a message between nodes
takes the inter-node α and β, and the nodes' network links carry one message's
bytes at a time in each direction (α is not held on the link). The time of the
collective is the slowest rank's, plus the fixed cost per call.

On one flat level this reproduces the closed formulas of `mpidp.collectives.cost`
(tests/test_sim_predict.py checks it); with two levels it shows what the
formulas cannot: which algorithm wins when some links are slower than others.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np

from mpidp import untrusted
from mpidp.collectives import cost
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.fold import fold
from mpidp.collectives.placement import layout
from mpidp.units import human

from .collective import names, resolve, simulate

MAX_INPUT = 64 << 20  # bytes of a calibration, cluster bench or collectives JSON file
# the rows of `python -m mpidp.bench collectives --json` that `read_measured` reads
MEASURED = untrusted.Record({
    "ranks": untrusted.Int(1, 1 << 20),
    "rows": untrusted.List(untrusted.Record({
        "collective": untrusted.Text(64), "algorithm": untrusted.Text(64),
        "bytes": untrusted.Int(0, 1 << 50), "time_us": untrusted.Num(0),
        "inplace": untrusted.Optional(untrusted.Bool())}, optional=frozenset({"inplace"})),
        max_len=1 << 20)})


class Network(NamedTuple):
    """α (s per message), β (s per byte), γ (s per reduced byte), fixed (s per call);
    ppn ranks per node (0: one level), with α and β between nodes."""

    alpha: float
    beta: float
    gamma: float
    fixed: float = 0.0
    ppn: int = 0
    alpha_inter: float = 0.0
    beta_inter: float = 0.0

    def flat(self) -> cost.Model:
        return cost.Model(self.alpha, self.beta, self.gamma, self.fixed)


class Timer:
    """The time of a schedule on `net`; the engine calls it (see `Sim`).

    Args:
        scale: real bytes per simulated byte (the schedule runs on fewer items).
        itemsize: bytes per simulated item (for the reductions' γ).
    """

    def __init__(self, N: int, net: Network, scale: float = 1.0, itemsize: int = 1):
        self.net, self.scale, self.item = net, scale, itemsize * scale
        self.clock = [0.0] * N  # when the rank is free to post its next round
        self.posted, self.ends = [0.0] * N, [0.0] * N
        self.send_free, self.recv_free = [0.0] * N, [0.0] * N
        nodes = -(-N // net.ppn) if net.ppn else 0
        self.out_free, self.in_free = [0.0] * nodes, [0.0] * nodes
        self.matched: list = []  # this step's messages, timed by `flush`

    def post(self, rank: int) -> None:
        self.posted[rank] = self.ends[rank] = self.clock[rank]

    def message(self, src: int, dst: int, nbytes: int, i: int = 0, j: int = 0) -> None:
        self.matched.append((i, j, src, dst, nbytes))

    def flush(self) -> None:
        """Time the messages matched in this step, each rank's in the order of its round."""
        net = self.net
        for _, _, src, dst, nbytes in sorted(self.matched):
            size = nbytes * self.scale
            start = max(self.posted[src], self.posted[dst], self.send_free[src],
                        self.recv_free[dst])
            if net.ppn and src // net.ppn != dst // net.ppn:
                a, b = src // net.ppn, dst // net.ppn
                wire = max(start, self.out_free[a], self.in_free[b])  # the nodes' links
                self.out_free[a] = self.in_free[b] = wire + size * net.beta_inter
                end = wire + net.alpha_inter + size * net.beta_inter
            else:
                end = start + net.alpha + size * net.beta
            self.send_free[src] = self.recv_free[dst] = end
            self.ends[src] = max(self.ends[src], end)
            self.ends[dst] = max(self.ends[dst], end)
        self.matched.clear()

    def complete(self, rank: int) -> None:
        self.clock[rank] = self.ends[rank]

    def work(self, rank: int, items: int) -> None:
        self.clock[rank] += items * self.item * self.net.gamma

    @property
    def seconds(self) -> float:
        return max(self.clock) + self.net.fixed


class Timers:
    """Several timers fed by one simulation (one per vector size)."""

    def __init__(self, timers: list):
        self.timers = timers

    def post(self, rank: int) -> None:
        for t in self.timers:
            t.post(rank)

    def message(self, src: int, dst: int, nbytes: int, i: int = 0, j: int = 0) -> None:
        for t in self.timers:
            t.message(src, dst, nbytes, i, j)

    def flush(self) -> None:
        for t in self.timers:
            t.flush()

    def complete(self, rank: int) -> None:
        for t in self.timers:
            t.complete(rank)

    def work(self, rank: int, items: int) -> None:
        for t in self.timers:
            t.work(rank, items)


ITEM = 4  # the predictions are for float32 vectors, as the benchmarks'


def sim_count(collective: str, algorithm, N: int, items: int) -> int:
    """Items to simulate for `items` real ones: all of them when few; else a count that
    splits into whole blocks for N and its power of two, scaled (direct: 2 items)."""
    if items <= 16 * N:
        return items
    q = fold(N)[0]  # the largest power of two <= N
    count = 2 * N * q // math.gcd(N, q)
    _, scratch, _ = resolve(collective, algorithm)
    if scratch is not None and scratch(Blocks.even(count, N)) > 2 * count:
        return 2  # a vector per rank of scratch: whole vectors travel, any count will do
    return count


def times(collective: str, algorithm, N: int, sizes: list[int], net: Network) -> list[float]:
    """Simulated seconds of one call for each vector size in `sizes` (bytes, float32)."""
    out, big = {}, [b for b in sizes if sim_count(collective, algorithm, N, b // ITEM) < b // ITEM]
    where = layout(N, ppn=net.ppn) if net.ppn else None  # the algorithms see the nodes too
    for b in sizes:  # small vectors: simulated at their own count
        if b not in big:
            timer = Timer(N, net, 1.0, ITEM)
            simulate(collective, algorithm, N, b // ITEM, dtype="float32", timer=timer,
                     placement=where, data=False)  # times, not sums: no data moves
            out[b] = timer.seconds
    if big:  # large ones: one simulation, scaled to each size
        count = sim_count(collective, algorithm, N, big[0] // ITEM)
        timers = [Timer(N, net, (b // ITEM) / count, ITEM) for b in big]
        simulate(collective, algorithm, N, count, dtype="float32", timer=Timers(timers),
                 placement=where, data=False)
        out.update({b: t.seconds for b, t in zip(big, timers, strict=True)})
    return [out[b] for b in sizes]


def predict(collective: str, ranks, sizes, net: Network, algorithms=None) -> list[dict]:
    """Rows of (N, bytes, {algorithm: simulated s}, {algorithm: formula s}, best, auto)."""
    algorithms = list(algorithms or names(collective))
    rows = []
    for N in ranks:
        sim = {a: times(collective, a, N, list(sizes), net) for a in algorithms}
        for i, b in enumerate(sizes):
            simulated = {a: sim[a][i] for a in algorithms}
            formula = {a: cost.predict(net.flat(), collective, a, b, N) for a in algorithms}
            rows.append({"N": N, "bytes": b, "sim": simulated, "formula": formula,
                         "best": min(algorithms, key=simulated.get),
                         "auto": cost.best(net.flat(), collective, tuple(algorithms), b, N)})
    return rows


def format_predict(rows: list[dict], measured: dict | None = None) -> str:
    """A Markdown table: µs per call simulated (the formula's in brackets), and measured."""
    algorithms = list(rows[0]["sim"])
    head = "| N | size | " + " | ".join(algorithms) + " | best (sim) | auto |"
    lines = [head, "|---:|---:|" + "---:|" * len(algorithms) + ":---|:---|"]
    for row in rows:
        cells = []
        for a in algorithms:
            cell = f"{row['sim'][a] * 1e6:.0f} ({row['formula'][a] * 1e6:.0f})"
            got = (measured or {}).get((row["N"], row["bytes"], a))
            cells.append(cell + (f" / {got:.0f}" if got is not None else ""))
        lines.append(f"| {row['N']} | {human(row['bytes'])} | " + " | ".join(cells)
                     + f" | {row['best']} | {row['auto']} |")
    return "\n".join(lines)


def switches(collective: str, N: int, net: Network, largest: int = 1 << 30) -> str:
    """Where `auto` (the formulas) changes its choice for N ranks, sizes 8 B .. `largest`."""
    parts, last = [], None
    b = 8
    while b <= largest:
        choice = cost.best(net.flat(), collective, names(collective), b, N)
        if choice != last:
            parts.append(f"{choice} from {human(b)}")
            last = choice
        b *= 2
    return f"N = {N}: auto takes " + ", ".join(parts)


def read_calibration(path: str) -> Network:
    """α, β, γ and the fixed cost from `python -m mpidp.bench calibrate`'s output."""
    return parse_calibration(untrusted.read_text(path, MAX_INPUT), path)


def parse_calibration(text: str, path: str) -> Network:
    """`read_calibration` of a file's `text` already read (`path`: named in its errors)."""
    found = {}
    for name, unit in (("fixed", "µs"), ("alpha", "µs"), ("beta", "ns"), ("gamma", "ns")):
        m = re.search(rf"{name} = ([0-9.eE+-]+) {unit}", text)
        if not m:
            raise untrusted.InputError(f"{path}: no '{name} = ... {unit}' line (is it "
                                       "calibrate's output?)")
        found[name] = float(m.group(1)) * (1e-6 if unit == "µs" else 1e-9)
    return Network(found["alpha"], found["beta"], found["gamma"], found["fixed"])


def fit_inter(path: str, gamma: float = 0.0, fixed: float = 0.0) -> tuple[float, float]:
    """(α, β) between nodes, fitted to a saved `python -m mpidp.cluster bench` output.

    The run must have one rank per host (``--ppn 1``, its default), so that every
    message crosses a link. Each mpidp algorithm's busbw row becomes a time; the
    reductions (`gamma` per byte) and the fixed cost, which the links do not change,
    are taken off, and α, β >= 0 are fitted to the rest by least squares in
    relative error, as `cost.fit` does.
    """
    text = untrusted.read_text(path, MAX_INPUT)
    head = re.search(r"^# (\d+) ranks", text, re.M)
    if not head:
        raise untrusted.InputError(f"{path}: no '# N ranks' line (is it mpidp.cluster "
                                   "bench's output?)")
    N, rows, seconds = int(head.group(1)), [], []
    for size, name, busbw in re.findall(r"^\s*([\d.]+) MiB\s+(\S+)\s+([\d.]+)\s+ratio", text,
                                        re.M):
        if name in names("allreduce"):
            nbytes = 4 * max(1, int(float(size) * 2**20) // 4)
            _, rounds, sent, reduced = cost.terms("allreduce", name, nbytes, N)
            rows.append((rounds, sent))
            seconds.append(nbytes * 2 * (N - 1) / N / (float(busbw) * 1e9) - fixed
                           - gamma * reduced)
    if len(rows) < 2:
        raise untrusted.InputError(f"{path}: fewer than two rows of mpidp algorithms to fit")
    a, t = np.array(rows) / np.array(seconds)[:, None], np.ones(len(rows))
    best, least = (0.0, 0.0), np.inf
    for cols in ([0, 1], [0], [1]):  # non-negative: both, or one of them alone
        x = np.zeros(2)
        x[cols] = np.linalg.lstsq(a[:, cols], t, rcond=None)[0]
        error = float(np.sum((a @ x - t) ** 2))
        if (x >= 0).all() and error < least:
            best, least = (float(x[0]), float(x[1])), error
    return best


def read_measured(path: str, collective: str) -> dict:
    """{(N, bytes, algorithm): µs} from `python -m mpidp.bench collectives --json` (in place
    rows, as calibrate times them; out of place where a size has none)."""
    data = untrusted.check(untrusted.read_json(path, MAX_INPUT), MEASURED, path)
    found = {}
    for row in sorted(data["rows"], key=lambda r: r.get("inplace") is True):
        if row["collective"] == collective and row["algorithm"] not in ("native", "auto"):
            found[data["ranks"], row["bytes"], row["algorithm"]] = row["time_us"]
    return found
