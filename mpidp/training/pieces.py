"""Pieces smaller than a layer: a layer's gradient reduced in parts as backward writes them.

With one reduction per layer (or per bucket of layers) the link idles until backward
has finished the bucket's last layer, and the first layer's gradient, written last,
can never hide. A model whose backward can be cut by rows (`protocol.py`'s optional
part, the MLP) computes dW_i in slices of rows (db_i first); each slice is a
contiguous part of the bucket's flat buffer, so it can be all-reduced on its own
the moment it is written, while the next slice is computed:

    bucket (W3, b3) | db3 W3[0:r] W3[r:2r] ... W3[..:in] | dx3 slices |
    piece 0         |      |== allreduce(W3[0:r]) ==|
    piece 1         |              |== allreduce(W3[r:2r]) ==|
    last piece      |                          |== allreduce(W3[..:in], b3) ==|

A piece's size trades the link's idle time against each reduction's fixed cost: the
cost model (`piece_bytes`) picks the smallest size whose per-call overhead (rounds
× α + fixed) is at most a tenth of its byte time. Each piece is a persistent
all-reduce planned once, like a whole bucket's. `cut` decides where pieces are cut
(``piece_mb="auto"``: only where the ranks span hosts, docs/overlap.md says why),
`reduction` makes one backward's `Reduction` of a bucket from them.
"""

from __future__ import annotations

from mpi4py import MPI

from .. import collectives as mp
from ..collectives import cost, placement
from ..collectives.algorithms.hosts import spans_hosts
from .buckets import Reduction
from .protocol import cuts_rows

MiB = 1 << 20
# bytes. Below LOW the cut products cost backward more than the pieces hide (a cut
# product re-packs its other operand, and each slice is a Python call and a progress
# call; docs/overlap.md has the measurements)
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


class RowsOnly:
    """``piece_mb=RowsOnly(mb)``: backward cut by rows as for pieces of `mb` MiB, with its
    progress calls between slices, and the buckets reduced whole (what the overlap
    benchmark compares)."""

    def __init__(self, mb: float | str):
        self.mb = mb if mb == "auto" else float(mb)  # "auto": the pieces' size rule


def check(piece_mb) -> None:
    """ValueError unless `piece_mb` is "auto", None, a size in MiB above 0 or a `RowsOnly`."""
    mb = piece_mb.mb if isinstance(piece_mb, RowsOnly) else piece_mb
    if mb is not None and mb != "auto" and not float(mb) > 0:
        raise ValueError(f"piece_mb must be > 0, 'auto' or None, not {piece_mb!r}")


class Piece:
    """Part [start, stop) of a bucket's flat buffer, complete once unit `unit`'s dW
    has `rows` rows written; its persistent all-reduce."""

    __slots__ = ("unit", "rows", "plan")

    def __init__(self, unit: int, rows: int, plan):
        self.unit, self.rows, self.plan = unit, rows, plan

    def start(self):
        self.plan.Start()
        return self.plan.request


def cut(model, comm, buckets, piece_mb, algorithm, overlap: bool) -> tuple[dict | None, dict,
                                                                         bool]:
    """(unit -> W's row stops or None, bucket index -> its pieces, whether comm spans hosts).

    ``piece_mb="auto"`` asks where the ranks run (a collective query) and cuts only
    across hosts, with `overlap`; None, or a model without the rows protocol: none.
    """
    across = False
    if piece_mb == "auto":
        across = comm.Get_size() > 1 and isinstance(comm, MPI.Intracomm) and \
            spans_hosts(placement.placement(comm))
        if not (across and overlap):
            return None, {}, across
    if piece_mb is None or not cuts_rows(model):
        return None, {}, across
    if isinstance(piece_mb, RowsOnly):
        return (*plan_pieces(model, comm, buckets, piece_mb.mb, algorithm, reduce=False), across)
    return (*plan_pieces(model, comm, buckets, piece_mb, algorithm), across)


def reduction(pieces: list[Piece]) -> Reduction:
    """One backward's reduction of a bucket in `pieces`: each starts once written."""
    return Reduction([p.start for p in pieces], {(p.unit, p.rows): k for k, p in enumerate(pieces)})


def plan_pieces(model, comm, buckets, piece_mb, algorithm,
                reduce: bool = True) -> tuple[dict | None, dict]:
    """Unit -> W's row stops (the model's ``row_stops``), bucket index -> its pieces.

    (None, {}) where a bucket's units are not W (in, out) then b (out,) in the buffer:
    whole buckets there. ``reduce=False``: the row stops alone (backward cut by rows,
    buckets reduced whole), no piece planned.
    """
    size = piece_bytes(comm, algorithm) if piece_mb == "auto" else int(float(piece_mb) * MiB)
    shapes = {name: g.shape for name, g in model.grads.items()}
    row_stops, layouts = {}, {}
    for b in buckets:
        offset, ends = 0, []
        for i in b.units:
            W, bias = model.names(i)
            if [W, bias] != [n for n in b.names if n in (W, bias)] or len(shapes[W]) != 2 \
                    or shapes[bias] != shapes[W][1:]:
                return None, {}
            n_in, n_out = shapes[W]
            rows = max(1, round(size / (n_out * model.grads[W].itemsize)))
            stops = [*range(rows, n_in, rows), n_in]
            row_stops[i] = stops
            ends += [(i, s, offset + s * n_out) for s in stops[:-1]]
            offset += n_in * n_out + n_out
            ends.append((i, n_in, offset))  # the last slice: b_i is written before it
        layouts[b.index] = ends
    if not reduce:
        return row_stops, {}
    pieces = {}
    for b in buckets:
        start, pieces[b.index] = 0, []
        for i, rows, stop in layouts[b.index]:
            persistent = mp.allreduce_init(comm, mp.IN_PLACE, b.flat[start:stop], op=mp.AVG,
                                           algorithm=algorithm)
            pieces[b.index].append(Piece(i, rows, persistent))
            start = stop
    return row_stops, pieces
