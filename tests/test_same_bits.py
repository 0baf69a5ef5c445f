"""Every all-reduce gives every rank bitwise the same result.

Data-parallel replicas stay identical only if every rank gets the same bits, and
floating point gives a pair's two orders the same bits only mostly: ``-0.0`` and
``0.0`` compare equal, so MAX and MIN return one or the other by their order; the
sum of two NaNs keeps the payload of the first; sums of three or more depend on
their grouping. So a reduction computed on several ranks must be computed in the
same order on each (the lower rank's operand first), or once and copied.

The inputs hold all of these; every rank's result bytes are gathered to every
rank and compared, for every algorithm (`mpidp.ALGORITHMS["allreduce"]`, the
folds of N not a power of two, two hosts for the placement-aware ones), in place
and out of place, and through a persistent all-reduce's replayed starts, for
N = 2..8 in one launch of 8 ranks (a communicator of each size:
tests/helpers/subcomms.py). The simulator does the same for N up to 64.
"""

import itertools

import numpy as np
import pytest
from helpers.subcomms import on_each_size

import mpidp
from mpidp.collectives import CountingComm, cost
from mpidp.collectives.api import ALGORITHMS
from mpidp.collectives.placement import layout
from mpidp.sim import simulate

pytestmark = pytest.mark.filterwarnings(  # inf - inf and overflowing products, on purpose
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning")

OPS = ("sum", "max", "min", "prod", "avg")
PLACED = ("rabenseifner", "hierarchical", "auto")  # they read the placement: two hosts too


def tricky(dtype, count: int, rank: int) -> np.ndarray:
    """Rank `rank`'s input: signed zeros, NaNs with payloads of its own, infinities, and
    floats of mixed magnitude whose sums depend on the order, item by item."""
    dt = np.dtype(dtype)
    bits = np.dtype(f"u{dt.itemsize}")
    rng = np.random.default_rng([rank, count, dt.itemsize])
    x = (rng.standard_normal(count) * 10.0 ** rng.integers(-6, 8, count)).astype(dt)
    k = np.arange(count)
    x[k % 5 == 0] = np.where((rank + k[k % 5 == 0]) % 2, -0.0, 0.0)  # -0.0 against 0.0
    nan = (k % 5 == 1) & ((rank + k) % 3 != 1)  # NaN on some ranks, numbers on the others
    quiet = np.array(np.nan, dt).view(bits)
    payload = (np.uint64(rank * 7919) + k[nan].astype(np.uint64)) % np.uint64(1 << 20) + 1
    x.view(bits)[nan] = quiet | payload.astype(bits)
    x[(k % 5 == 2) & (rank % 2 == 0)] = np.inf  # inf + -inf: a NaN, which one
    x[(k % 5 == 2) & (rank % 3 == 1)] = -np.inf
    return x


def differing(results) -> list[int]:
    """The ranks whose result bytes differ from rank 0's."""
    return [r for r, y in enumerate(results) if y.tobytes() != results[0].tobytes()]


def gathered(comm, y) -> np.ndarray:
    """Every rank's result bytes, on every rank (MPI's own Allgather)."""
    rows = np.empty((comm.Get_size(), y.nbytes), np.uint8)
    comm.Allgather(y.view(np.uint8), rows)
    return rows


def same_bits_on_every_rank(comm) -> list[str]:
    """Every algorithm, op, dtype and count shape on `comm` (one host, and two for the
    placement-aware ones): the cases where some rank's bits differ from rank 0's."""
    n, rank = comm.Get_size(), comm.Get_rank()
    cost.set_model(comm, *cost.DEFAULT)  # auto without calibrating (seconds under load)
    two_hosts = CountingComm(comm, placement=layout(n, ppn=(n + 1) // 2))
    bad, case = [], 0
    for algorithm in ALGORITHMS["allreduce"]:
        comms = [("one host", comm)] + ([("two hosts", two_hosts)] if algorithm in PLACED else [])
        for where, c in comms:
            for op in OPS:
                dtype = ("float64", "float32")[case % 2]
                count = (1, 23, 4099)[case % 3]  # one item, < blocks, > N blocks
                x = tricky(dtype, count, rank)
                y = np.empty_like(x)
                if case % 4 < 2:
                    mpidp.allreduce(c, x, y, op=op, algorithm=algorithm)
                else:
                    y[...] = x
                    mpidp.allreduce(c, mpidp.IN_PLACE, y, op=op, algorithm=algorithm)
                case += 1
                rows = gathered(comm, y)
                if not (rows == rows[0]).all():
                    bad.append(f"{algorithm} ({where}) {op} {dtype} count {count}: ranks "
                               f"{[r for r in range(n) if (rows[r] != rows[0]).any()]} "
                               "differ from rank 0")
    return [f"N={n}: {b}" for b in bad]


@pytest.mark.mpi(ranks=[8], timeout=450)
def test_every_allreduce_gives_every_rank_the_same_bits(mpi_ranks):
    def check(comm):
        bad = same_bits_on_every_rank(comm)
        assert not bad, "\n".join(bad[:10])

    on_each_size(range(2, 9), check)


def replayed_keeps_the_order(comm) -> list[str]:
    """A persistent all-reduce replays its first run's reductions: the same bits every start,
    on every rank, as the blocking call's (one item, and blocks of one item, included:
    NumPy computes ``ufunc(a, b, out=a)`` on one item with the operands swapped)."""
    cost.set_model(comm, *cost.DEFAULT)
    bad = []
    for algorithm, op, count in itertools.product(ALGORITHMS["allreduce"], ("sum", "max"),
                                                  (1, 7, 37)):
        x = tricky("float64", count, comm.Get_rank())
        once = np.empty_like(x)
        mpidp.allreduce(comm, x, once, op=op, algorithm=algorithm)
        y = np.empty_like(x)
        req = mpidp.allreduce_init(comm, x, y, op=op, algorithm=algorithm)
        for start in range(3):  # the first recorded, the others replayed
            y[...] = 0
            req.Start()
            req.Wait()
            rows = gathered(comm, y)
            if not (rows == rows[0]).all() or y.tobytes() != once.tobytes():
                bad.append(f"N={comm.Get_size()}: {algorithm} {op} {count} start {start}")
        req.Free()
    return bad


@pytest.mark.mpi(ranks=[8], timeout=240)
def test_replayed_persistent_allreduce_keeps_the_order(mpi_ranks):
    def check(comm):
        bad = replayed_keeps_the_order(comm)
        assert not bad, bad

    on_each_size((2, 5, 8), check)


def blocking_replays_keep_the_order(comm) -> list[str]:
    """A blocking all-reduce like an earlier one replays its record (`blocking`): the bits of
    the planned call (an explicit tag is planned), on every rank, in and out of place."""
    cost.set_model(comm, *cost.DEFAULT)
    bad = []
    for algorithm, op, count, in_place in itertools.product(
            ALGORITHMS["allreduce"], ("sum", "max", "avg"), (1, 7, 37), (False, True)):
        x = tricky("float64", count, comm.Get_rank())
        send = mpidp.IN_PLACE if in_place else x
        planned = x.copy()
        mpidp.allreduce(comm, send, planned, op=op, algorithm=algorithm, tag=7)
        for call in range(3):  # the first planned and recorded, the others replayed
            y = x.copy()
            mpidp.allreduce(comm, send, y, op=op, algorithm=algorithm)
            rows = gathered(comm, y)
            if not (rows == rows[0]).all() or y.tobytes() != planned.tobytes():
                bad.append(f"N={comm.Get_size()}: {algorithm} {op} {count} in place "
                           f"{in_place} call {call}")
    return bad


@pytest.mark.mpi(ranks=[8], timeout=240)
def test_replayed_blocking_allreduce_keeps_the_order(mpi_ranks, no_debug_check):
    def check(comm):
        bad = blocking_replays_keep_the_order(comm)
        assert not bad, bad

    on_each_size((2, 3, 5, 8), check)


@pytest.mark.parametrize("algorithm", ALGORITHMS["allreduce"][:-1])
def test_simulated_allreduce_gives_every_rank_the_same_bits(algorithm):
    """N = 2..64; the placement-aware ones on one host and on several (2, 3 or 4 ranks a
    host, rotating with N)."""
    for n in [*range(2, 14), 16, 17, 24, 31, 32, 33, 48, 63, 64]:
        placements = [None]
        if algorithm in PLACED:
            placements.append(layout(n, ppn=min(2 + n % 3, n - 1)))
        for i, placement in enumerate(placements):
            for j in range(2):  # two of the ops, rotating with N
                op = OPS[(n + i + 2 * j) % len(OPS)]
                dtype = ("float64", "float32")[(n + i + j) % 2]
                count = (1, 13, 130)[(n + i + j) % 3]
                inputs = [tricky(dtype, count, r) for r in range(n)]
                out = simulate("allreduce", algorithm, n, count, inputs=inputs, op=op,
                               in_place=bool((n + j) % 2), placement=placement)
                assert not differing(out.results), (n, placement, op, dtype, count,
                                                    differing(out.results))
