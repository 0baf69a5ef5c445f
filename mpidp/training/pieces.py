"""Pieces smaller than a layer: a layer's gradient reduced in parts as backward writes them.

With one reduction per layer (or per bucket of layers) the link idles until backward
has finished the bucket's last layer, and the first layer's gradient, written last,
can never hide. `MLP.backward` with ``blocks`` computes dW_i in row blocks (db_i
first); each block is a contiguous part of the bucket's flat buffer, so it can be
all-reduced on its own the moment it is written, while the next block is computed:

    bucket (W3, b3) | db3 W3[0:r] W3[r:2r] ... W3[..:in] | dx3 blocks |
    piece 0         |      |== allreduce(W3[0:r]) ==|
    piece 1         |              |== allreduce(W3[r:2r]) ==|
    last piece      |                          |== allreduce(W3[..:in], b3) ==|

A piece's size trades the link's idle time against each reduction's fixed cost: the
cost model (`piece_bytes`) picks the smallest size whose per-call overhead (rounds
× α + fixed) is at most a tenth of its byte time. Each piece is a persistent
all-reduce planned once, like a whole bucket's.
"""

from __future__ import annotations

import time

from .. import collectives as mp
from ..collectives import cost, placement
from ..collectives.algorithms.hosts import spans_hosts

MiB = 1 << 20
# bytes. Below LOW the cut products cost backward more than the pieces hide: measured
# across 2 hosts (docs/overlap.md), 64 KiB pieces doubled an MLP's backward, 128 and
# 256 KiB added 5-25%, 512 KiB nothing measurable (a cut product re-packs its other
# operand, and each block is a Python call and a progress call)
LOW, HIGH = 512 << 10, 4 << 20


def piece_bytes(comm, algorithm) -> int:
    """The smallest piece whose reduction's overhead is at most 1/10 of its byte time
    under the comm's cost model (the same number on every rank), in [LOW, HIGH]."""
    p = comm.Get_size()
    if p == 1:
        return HIGH
    m = cost.model(comm)
    hosts = placement.placement(comm)
    hosts = hosts if spans_hosts(hosts) else None
    names = tuple(n for n in mp.ALGORITHMS["allreduce"] if n != "auto")
    name = algorithm if algorithm in names else cost.best(m, "allreduce", names, MiB, p, hosts)
    overhead = cost.predict(m, "allreduce", name, 0, p, hosts)
    per_byte = (cost.predict(m, "allreduce", name, MiB, p, hosts) - overhead) / MiB
    if per_byte <= 0:
        return HIGH
    return int(min(HIGH, max(LOW, 10 * overhead / per_byte)))


class Piece:
    """Part [start, stop) of a bucket's flat buffer, complete once layer `layer`'s dW
    has `rows` rows written; its persistent all-reduce."""

    __slots__ = ("layer", "rows", "plan", "launched")

    def __init__(self, layer: int, rows: int, plan):
        self.layer, self.rows, self.plan, self.launched = layer, rows, plan, None


def plan_pieces(model, comm, buckets, piece_mb, algorithm,
                reduce: bool = True) -> tuple[dict | None, dict]:
    """Layer -> W's row stops (`MLP.backward`'s ``blocks``), bucket index -> its pieces.

    (None, {}) where a bucket's layers are not an MLP's (W (in, out), then b (out,), in
    the buffer): whole buckets there. ``reduce=False``: the row stops alone (backward
    cut in blocks, buckets reduced whole), no piece planned.
    """
    size = piece_bytes(comm, algorithm) if piece_mb == "auto" else int(float(piece_mb) * MiB)
    shapes = {name: g.shape for name, g in model.grads.items()}
    blocks, layouts = {}, {}
    for b in buckets:
        offset, ends = 0, []
        for i in b.layers:
            W, bias = model.names(i)
            if [W, bias] != [n for n in b.names if n in (W, bias)] or len(shapes[W]) != 2 \
                    or shapes[bias] != shapes[W][1:]:
                return None, {}
            n_in, n_out = shapes[W]
            rows = max(1, round(size / (n_out * model.grads[W].itemsize)))
            stops = [*range(rows, n_in, rows), n_in]
            blocks[i] = stops
            ends += [(i, s, offset + s * n_out) for s in stops[:-1]]
            offset += n_in * n_out + n_out
            ends.append((i, n_in, offset))  # the last block: b_i is written before it
        layouts[b.index] = ends
    if not reduce:
        return blocks, {}
    pieces = {}
    for b in buckets:
        start, pieces[b.index] = 0, []
        for i, rows, stop in layouts[b.index]:
            plan = mp.allreduce_init(comm, mp.IN_PLACE, b.flat[start:stop], op=mp.AVG,
                                     algorithm=algorithm)
            pieces[b.index].append(Piece(i, rows, plan))
            start = stop
    return blocks, pieces


class PieceSet:
    """One backward's reduction of a bucket in pieces: started in order as backward
    writes them (`written`), the rest by `start_rest`; a request-like object."""

    def __init__(self, pieces: list[Piece]):
        self.pieces, self.next = pieces, 0
        self._at = {(p.layer, p.rows): k for k, p in enumerate(pieces)}

    def written(self, layer: int, rows: int) -> None:
        """Layer's dW has `rows` rows: start every piece up to the one that completes."""
        k = self._at.get((layer, rows))
        if k is not None:
            self._start(k + 1)

    def start_rest(self) -> None:
        self._start(len(self.pieces))

    def _start(self, upto: int) -> None:
        for piece in self.pieces[self.next:upto]:
            piece.launched = time.perf_counter()
            piece.plan.Start()
        self.next = max(self.next, upto)

    def started(self) -> list:
        return [p.plan.request for p in self.pieces[:self.next]]

    @property
    def done(self) -> bool:
        return self.next == len(self.pieces) and all(r.done for r in self.started())

    def test(self) -> bool:
        return mp.testall(self.started()) and self.next == len(self.pieces)

    def Test(self, status=None) -> bool:  # noqa: N802
        return self.test()

    def __bool__(self) -> bool:
        return self.next > 0

    @property
    def rounds(self) -> int:
        """As one request's: 1 + the rounds past each piece's first."""
        return 1 + sum(r.rounds - 1 for r in self.started())

    @property
    def launched(self) -> float:
        return self.pieces[0].launched

    @property
    def completed_at(self) -> float | None:
        ends = [r.completed_at for r in self.started()]
        return None if None in ends or not ends else max(ends)

    def times(self) -> list[tuple[float, float]]:
        return [(p.launched, p.plan.request.completed_at) for p in self.pieces]
