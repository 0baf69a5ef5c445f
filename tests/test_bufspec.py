"""mpidp.Comm takes every buffer kind that mpi4py takes, and leaves every byte MPI leaves.

One body (tests/helpers/differential.py) runs each collective that mpidp.Comm implements,
blocking and I-form (and the persistent ``*_init`` form where mpidp.Comm has one),
on ``MPI.COMM_WORLD`` and on ``mpidp.Comm`` with identical inputs, for every buffer
form mpi4py accepts (NumPy C and Fortran order, ``array.array``, ``bytearray``,
``memoryview``, DLPack producers, ``[buf, type]``, ``[buf, count, type]``,
``[buf, (count, displ), type]``, ``[buf, count, displ, type]``, the vector forms),
both ways to say "in place" (``MPI.IN_PLACE``, ``None``),
and the buffers mpi4py refuses (non-contiguous, read-only), which mpidp.Comm
must refuse with the same exception. Whole buffers are compared.
"""

from __future__ import annotations

import gc
import importlib.util

import numpy as np
import pytest
from helpers.differential import FORMS, REFUSED, Case, check_against_native, supports
from helpers.dlpackbuf import Exported, NumpyProducer
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp

COLLECTIVES = {  # mpidp.Comm's collectives -> their key in mpidp.ALGORITHMS
    "Allreduce": "allreduce", "Reduce_scatter_block": "reduce_scatter",
    "Reduce_scatter": "reduce_scatter", "Allgather": "allgather", "Allgatherv": "allgather",
    "Bcast": "bcast",
}
IN_PLACE = {"Allreduce": (True, "None"), "Reduce_scatter_block": (True, "None"),
            "Reduce_scatter": (True, "None"), "Allgather": (True, "None"),
            "Allgatherv": (True, "None"), "Bcast": ()}
DTYPE_OPS = [("f8", "SUM"), ("i4", "PROD"), ("f4", "MAX"), ("i8", "MIN"), ("?", "LAND"),
             ("u1", "BOR"), ("i2", "BXOR"), ("u2", "LOR"), ("c16", "SUM"), ("i4", "LXOR"),
             ("u4", "BAND"), ("c8", "PROD")]
LAYOUTS = ("packed", "listed", "reversed", "untyped", "equal", "strided", "inferred")


def modes(collective: str, i: int, refused: bool = False) -> tuple[str, ...]:
    """Blocking, the I-form (completed by Wait or by Test, by turns), and *_init if any.

    Not *_init for refused buffers: after mpi4py refuses one in Allgatherv_init, Open MPI
    5.0.11's next persistent collectives fail (truncated messages, then a heap error),
    with no mpidp involved.
    """
    persistent = hasattr(mpidp.Comm, collective + "_init") and not refused
    return ("blocking", ("Wait", "Test")[i % 2], *(("init",) if persistent else ()))


def kind_cases(collective: str, n: int) -> list[Case]:
    """Every buffer form, in-place spelling and refused buffer, for one collective.

    The *_init cases come last, each with the parameters of its blocking sibling: so
    every other case keeps the parameters it has without them (they rotate with the
    case's index; shifted, a refused buffer can fall to one item on some rank, which
    mpi4py accepts whatever its stride, and the MPI library's own call then hangs).
    """
    cases, persistent = [], []

    def add(form, in_place=False, count=None, dtype_op=None, **kw):
        i = len(cases)
        dtype, op = dtype_op or DTYPE_OPS[i % len(DTYPE_OPS)]
        if not supports(form, dtype):
            dtype, op = "f8", "SUM"
        for mode in modes(collective, i, form in REFUSED):
            (persistent if mode == "init" else cases).append(
                Case(collective, (1, n + 1, 7, 0)[i % 4] if count is None else count,
                     dtype, op, form=form, in_place=in_place, mode=mode,
                     root=i % n, layout=LAYOUTS[i % len(LAYOUTS)], **kw))

    for form in FORMS:
        add(form)
    for in_place in IN_PLACE[collective]:
        for form in ("array", "typed", "displ", "dlpack", "bytearray"):
            add(form, in_place, count=n + 2)
    for form in REFUSED:
        add(form, count=3)
    if collective != "Bcast":  # random floats: the summation-order tolerance
        add("array", count=1003, dtype_op=("f8", "SUM"), floats=True)
        add("array", True, count=1003, dtype_op=("f4", "PROD"), floats=True)
    return cases + persistent


def check_every_buffer_kind_matches_native(world):
    for collective, key in COLLECTIVES.items():
        cases = kind_cases(collective, world.Get_size())
        every = {i for i, case in enumerate(cases) if case.in_place or case.form in REFUSED}
        check_against_native(cases, key, every, world)


def check_dlpack_capsule_lives_while_the_collective_runs(world):
    """The producer's deleter runs once the collective and the request are gone, not before
    (on one rank the collective is complete as it starts)."""
    comm = mpidp.Comm(world)
    n = comm.Get_size()
    x, y = np.arange(6.0), np.zeros(6)
    X, Y = Exported(x, versioned=False), Exported(y, tied=True)
    request = comm.Iallreduce(X, Y)
    gc.collect()
    assert X.live == Y.live == 1  # held by the collective in flight
    request.Wait()
    assert np.array_equal(y, x * n)
    del request
    gc.collect()
    assert (X.exported, X.live, Y.exported, Y.live) == (1, 0, 1, 0)
    assert Exported.double_deletes == 0


# Every rank count in one launch (a launch of ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[5], timeout=180)
def test_every_buffer_kind_matches_native(mpi_ranks):
    """Each collective x each buffer kind, blocking and I-form, against MPI's own (N = 1..5);
    the in-place and refused (or, for Bcast's root, read-only) buffers with every algorithm.
    Then a DLPack capsule lives while the collective runs (N = 2, 3)."""
    on_each_size(range(1, 6), check_every_buffer_kind_matches_native)
    gc.collect()  # every DLPack export deleted, once, and only now
    from helpers.differential import EXPORTS

    assert EXPORTS and all(e.live == 0 for e in EXPORTS), [e.live for e in EXPORTS]
    assert Exported.double_deletes == 0
    on_each_size((2, 3), check_dlpack_capsule_lives_while_the_collective_runs)


def test_a_read_only_dlpack_buffer_is_refused_for_writing_only():
    """The versioned read-only flag: mpi4py refuses such a recvbuf; so does mpidp.Comm."""
    ro = np.arange(3.0)
    ro.flags.writeable = False
    out = np.zeros(3)
    for comm in (MPI.COMM_WORLD, mpidp.Comm(MPI.COMM_WORLD)):
        with pytest.raises(BufferError, match="not writable"):
            comm.Allreduce(np.ones(3), NumpyProducer(ro))
        comm.Allreduce(NumpyProducer(ro), out)  # read-only is fine to send
        assert np.array_equal(out, ro * comm.Get_size())


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="CuPy is installed: a GPU buffer is taken, not refused")
def test_a_gpu_buffer_without_cupy_says_cupy_is_needed():
    class CudaArray:  # what Numba, PyTorch, ... expose
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f8", "data": (0, False),
                                    "version": 3}

    class DeviceDLPack(NumpyProducer):
        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

    comm = mpidp.Comm(MPI.COMM_WORLD)
    for gpu in (CudaArray(), DeviceDLPack(np.zeros(3))):
        with pytest.raises(ModuleNotFoundError, match="CuPy") as info:
            comm.Allreduce(MPI.IN_PLACE, gpu)
        assert "GPU" in str(info.value) and info.value.name == "cupy"


def test_dlpack_and_duplicate_datatypes():
    """One process: a DLPack-only object, and a duplicated predefined datatype."""

    class DLPackOnly:  # exposes its memory through DLPack alone, not the buffer protocol
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kwargs):
            return self.arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    comm = mpidp.Comm(MPI.COMM_WORLD)
    n = comm.Get_size()
    y = np.zeros(3)
    comm.Allreduce(DLPackOnly(np.arange(3.0)), DLPackOnly(y))
    assert np.array_equal(y, np.arange(3.0) * n)
    double = MPI.DOUBLE.Dup()
    comm.Allreduce(MPI.IN_PLACE, [y, double])
    assert np.array_equal(y, np.arange(3.0) * n * n)
    double.Free()
