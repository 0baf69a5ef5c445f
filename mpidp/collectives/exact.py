"""The exact, order-independent sum on the call path: EXACT_SUM, EXACT_AVG, and sums of parts.

    mpidp.allreduce(comm, x, y, op=mpidp.EXACT_SUM)          # y: the same bits on any N
    req = mpidp.iallreduce_parts(comm, [g0, g1, g2], out, addends=12)

An exact collective is three passes (prerounding.py has the derivation): a MAX
all-reduce of a small code per item, the SUM all-reduce (or reduce-scatter) of
integer words with the chosen algorithm, the conversion back. `exact_rounds`
chains the two collectives' generators into one generator of rounds, so the
blocking call, the I-form, the persistent ``*_init`` and `mpidp.Comm` all run it
through the same `Plan` as any collective, with one tag.

`iallreduce_parts` sums several arrays per rank (a rank may hold any number of
the addends, none included): the result is bitwise what EXACT_SUM gives on the
same multiset of addends, however they are spread over ranks, provided every
rank passes the same total `addends` (the grid depends on it). On a communicator
of one rank (``MPI.COMM_SELF``, or one `mpidp.sim` rank) it is a local exact sum.
"""

from __future__ import annotations

from mpi4py import MPI

from .blocks import Blocks
from .buffers import array_module, flat
from .checks import check_buffer
from .ops import EXACT_AVG, EXACT_SUM, Op
from .plan import Call, Plan, Setup, planned, signed
from .prerounding import exact_rounds, grid, scratch_for
from .schedule import Request
from .topology import locate

# A reduce-scatter's MAX pass (an all-reduce of the codes) by the algorithm of its family
CODE_FOR = {"ring": "ring", "recursive_halving": "rabenseifner"}


def _check_parts(parts, out) -> list:
    check_buffer(out, "out", writable=True)
    if array_module(out) is not __import__("numpy"):
        raise TypeError("the exact sum takes NumPy arrays (CuPy arrays are not supported)")
    parts = list(parts)
    for i, x in enumerate(parts):
        check_buffer(x, f"parts[{i}]")
        if x.dtype != out.dtype or x.size != out.size:
            raise ValueError(f"parts[{i}] is {x.size} items of {x.dtype}, out {out.size} of "
                             f"{out.dtype}: every part must match out")
    return [flat(x) for x in parts]


def plan_exact(call: Call, parts: list, out, op: Op, algorithm: str, addends: int,
               blocks: Blocks | None = None) -> Plan:
    """The plan of an exact all-reduce (or, with `blocks`, reduce-scatter) of `parts`.

    Args:
        parts: this rank's addends, flat arrays of the vector's size.
        out: the result: the vector (all-reduce) or this rank's block (reduce-scatter).
        algorithm: for the SUM pass, and the MAX pass (a reduce-scatter's: `CODE_FOR`).
        addends: over all ranks, the same on every rank.
    """
    from . import api  # (api imports this module on its exact path)

    comm = call.comm
    rs = blocks is not None
    count = blocks.total if rs else out.size
    g = grid(out.dtype, addends)

    def setup() -> Setup:
        collective = "reduce_scatter" if rs else "allreduce"
        word_name = api.choose(comm, collective, count * g.words * 8, algorithm)
        code_name = (CODE_FOR[word_name] if rs else
                     api.choose(comm, "allreduce", count * g.code.itemsize, algorithm))
        code_algo, code_scratch = api.ALLREDUCE[code_name]
        word_algo, word_scratch = (api.REDUCE_SCATTER if rs else api.ALLREDUCE)[word_name]
        word_blocks = (Blocks([c * g.words for c in blocks.counts]) if rs
                       else Blocks.even(count * g.words, comm.Get_size()))
        items = (code_scratch(Blocks.even(count, comm.Get_size())), word_scratch(word_blocks))
        return Setup(signed(collective, (blocks.counts if rs else count, addends), out.dtype, op,
                            f"{code_name}+{word_name}"),
                     (code_name, code_algo, word_name, word_algo), blocks, items)

    key = ("exact", rs, count, blocks and blocks.counts, out.dtype, op.name, algorithm, addends)
    s = call.setup(key, setup)
    tag = call.tag(s.signed)
    code_name, code_algo, word_name, word_algo = s.algo
    locate(comm, call.state, "allreduce", code_name)
    locate(comm, call.state, "reduce_scatter" if rs else "allreduce", word_name)
    scratch = scratch_for(call.state.pool, g, count, *s.scratch)
    args = (comm, parts, out, g, code_algo, word_algo, scratch, op.divide, blocks)
    return Plan(call, exact_rounds, args, tag, None, tuple(scratch))


@planned
def plan_parts(call: Call, parts, out, addends: int, algorithm: str = "auto",
               average: bool = False) -> Plan:
    """Check and set up the exact sum of every rank's `parts` into `out`."""
    parts = _check_parts(parts, out)
    if out.dtype.kind not in "f":
        raise TypeError(f"the exact sum of parts takes float arrays, not {out.dtype}")
    return plan_exact(call, parts, flat(out), EXACT_AVG if average else EXACT_SUM, algorithm,
                      int(addends))


def iallreduce_parts(comm, parts, out, *, addends: int, algorithm: str = "auto",
                     average: bool = False, **kw) -> Request:
    """Start the exact sum over all ranks of all arrays in `parts` into `out`.

    Args:
        parts: this rank's addends: arrays of out's size and dtype (float16/32/64); any
            number of them, none included. They are read until the request completes.
        out: the result, the same bits on every rank; it may be one of the parts.
        addends: the number of addends over all ranks, the same on every rank. The
            result is bitwise EXACT_SUM's over the same multiset of addends.
        algorithm: the all-reduce algorithm of the SUM pass (and of the MAX pass).
        average: divide by `addends` (EXACT_AVG).
        tag, debug: as for every collective.
    Returns: a Request (``test()``, ``wait()``).
    """
    return plan_parts(comm, parts, out, addends, algorithm, average, **kw).start()


def allreduce_parts(comm, parts, out, *, addends: int, algorithm: str = "auto",
                    average: bool = False, **kw) -> None:
    """The blocking `iallreduce_parts`."""
    plan_parts(comm, parts, out, addends, algorithm, average, **kw).run()


def sum_parts(parts, out, *, average: bool = False) -> None:
    """The local exact sum of `parts` into `out`: `allreduce_parts` on ``MPI.COMM_SELF``."""
    parts = list(parts)
    allreduce_parts(MPI.COMM_SELF, parts, out, addends=len(parts), average=average)


@planned
def plan_parts_rs(call: Call, parts, out, counts, addends: int, algorithm: str = "auto",
                  average: bool = False) -> Plan:
    """Check and set up the exact reduce-scatter of every rank's `parts` into `out`."""
    blocks = Blocks(counts)
    if len(blocks.counts) != call.comm.Get_size():
        raise ValueError(f"need one count per rank ({call.comm.Get_size()}), got "
                         f"{len(blocks.counts)}")
    mine = blocks.counts[call.comm.Get_rank()]
    check_buffer(out, "out", writable=True)
    if out.size != mine:
        raise ValueError(f"out holds {out.size} items, this rank's block {mine}")
    whole = array_module(out).empty(blocks.total, dtype=out.dtype)  # only for the checks
    parts = _check_parts(parts, whole)
    if out.dtype.kind not in "f":
        raise TypeError(f"the exact sum of parts takes float arrays, not {out.dtype}")
    return plan_exact(call, parts, flat(out), EXACT_AVG if average else EXACT_SUM, algorithm,
                      int(addends), blocks)


def ireduce_scatter_parts(comm, parts, out, counts, *, addends: int, algorithm: str = "auto",
                          average: bool = False, **kw) -> Request:
    """Start the exact sum over all ranks of all `parts`, rank r getting block r into `out`.

    As `iallreduce_parts`, with the result scattered: block r (``counts[r]`` items, the
    blocks packed in rank order) is rank r's `out`. `out` may be the front of one of the
    parts (an in-place reduce-scatter's place): the parts are read before it is written.
    `algorithm` is a reduce-scatter name (``"ring"``, ``"recursive_halving"``, ``"auto"``).
    """
    return plan_parts_rs(comm, parts, out, counts, addends, algorithm, average, **kw).start()
