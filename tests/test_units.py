"""Single-process specifications: blocks, ops, the schedule engine, scratch reuse."""

import numpy as np
import pytest
from mpi4py import MPI

from mpidp.collectives.algorithms import ops as O
from mpidp.collectives.algorithms.blocks import Blocks
from mpidp.collectives.algorithms.rounds import Recv, Send
from mpidp.collectives.engine.driver import Handle, run
from mpidp.collectives.engine.staging import ScratchPool
from mpidp.collectives.mpiops import resolve_op


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 10, 13, 1 << 20])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_even_blocks_tile_the_buffer(count, n):
    b = Blocks.even(count, n)
    assert len(b) == n and sum(b.counts) == count == b.total
    assert max(b.counts) - min(b.counts) <= 1
    assert b.packed and b.extent == count
    covered = np.concatenate([np.arange(count)[b.span(i, i + 1)] for i in range(n)])
    assert np.array_equal(covered, np.arange(count))
    assert b.max == (max(b.counts) if count else 0)


def test_blocks_examples_and_errors():
    b = Blocks.even(10, 4)
    assert b.counts == (3, 3, 2, 2) and b.displs == (0, 3, 6, 8)
    assert list(b.view(np.arange(10), 2)) == [6, 7]
    gapped = Blocks([1, 2], [0, 3])
    assert not gapped.packed and gapped.extent == 5
    with pytest.raises(ValueError):
        Blocks([1, -1])
    with pytest.raises(ValueError):
        Blocks.even(4, 0)
    with pytest.raises(ValueError):
        Blocks([1, 2], [0])


def test_ops_follow_mpi_semantics():
    a, b = np.array([1, 5, -2]), np.array([3, 2, -7])
    for name, want in [("sum", a + b), ("prod", a * b), ("max", np.maximum(a, b)),
                       ("min", np.minimum(a, b)), ("band", a & b), ("bor", a | b),
                       ("bxor", a ^ b), ("land", (a != 0) & (b != 0))]:
        acc = a.copy()
        O.OPS[name](acc, b)
        assert np.array_equal(acc, want.astype(acc.dtype)), name
    acc = np.array([2.0, 4.0])
    O.AVG(acc, np.array([2.0, 2.0]))
    O.AVG.finish(acc, 4)
    assert np.array_equal(acc, [1.0, 1.5])


def test_op_dtype_rules_and_resolution():
    with pytest.raises(TypeError, match="complex"):
        O.MAX.check(np.complex128)
    with pytest.raises(TypeError):
        O.AVG.check(np.int32)  # an integer average would truncate
    with pytest.raises(TypeError):
        O.BXOR.check(np.float64)
    O.SUM.check(np.float16)
    assert resolve_op(MPI.SUM) is O.SUM and resolve_op("max") is O.MAX
    assert resolve_op(MPI.BXOR) is O.BXOR
    with pytest.raises(ValueError, match="unknown op"):
        resolve_op("mean")
    with pytest.raises(NotImplementedError, match="MAXLOC"):
        resolve_op(MPI.MAXLOC)
    with pytest.raises(TypeError):
        resolve_op(3)


def test_scratch_pool_reuses_buffers_of_the_same_size():
    pool = ScratchPool()
    like = np.zeros(1, np.float32)
    a = pool.take(like, 100)
    pool.give(a)
    assert pool.take(like, 100) is a  # reused, not reallocated
    b = pool.take(like, 100)
    assert b is not a  # two collectives in flight get two buffers
    assert pool.take(np.zeros(1, np.float64), 100).dtype == np.float64


def test_schedule_runs_rounds_in_order_and_counts_them():
    """A one-rank 'exchange with myself' schedule, blocking and nonblocking."""
    comm = MPI.COMM_SELF
    log = []

    def rounds(buf, tmp):
        for step in range(3):
            yield [Send(buf, 0), Recv(tmp, 0)]
            buf += tmp  # local work happens after the round completes
            log.append(step)

    buf, tmp = np.ones(4), np.empty(4)
    assert run(comm, rounds(buf, tmp), tag=5) == 3
    assert log == [0, 1, 2] and np.array_equal(buf, [8.0] * 4)
    log.clear()
    done = []
    h = Handle(comm, rounds(buf, tmp), tag=5, on_done=lambda: done.append(True))
    while not h.test():
        pass
    assert h.done and h.rounds == 3 and done == [True]
    assert np.array_equal(buf, [64.0] * 4)
    h.wait()  # waiting on a finished handle is a no-op
