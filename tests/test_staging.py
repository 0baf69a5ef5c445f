"""Staging: the GPU path, tested without a GPU (staging, stream sync, CUDA-awareness
detection), and the scratch pool.

Real CuPy runs are in `make gpu-check` (examples/gpu_check.py) on a machine with
a GPU; here a stand-in device array and a stand-in `cupy` module record what the
engine does with device buffers, and MPIDP_STAGING=1 runs the staging code with
NumPy buffers across ranks against MPI's own results.
"""

import sys
import types

import numpy as np
import pytest
from helpers.gpu import needs_gpu
from helpers.subcomms import on_each_size
from mpi4py import MPI

import mpidp
from mpidp.collectives import ScratchPool
from mpidp.collectives.algorithms.rounds import Recv, Send
from mpidp.collectives.engine import driver as schedule
from mpidp.collectives.engine import staging as buffers
from mpidp.collectives.state import state


class FakeDeviceArray(np.ndarray):
    """A host array that claims to live on a GPU (has __cuda_array_interface__)."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.__array_interface__["data"][0], False)}

    def get(self, out):
        np.copyto(out, np.asarray(self))

    def set(self, host):
        np.copyto(np.asarray(self), host)


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in `cupy` module that counts stream synchronizations."""
    calls = {"sync": 0}
    stream = types.SimpleNamespace(synchronize=lambda: calls.__setitem__("sync",
                                                                         calls["sync"] + 1))
    cuda = types.SimpleNamespace(get_current_stream=lambda: stream,
                                 alloc_pinned_memory=lambda nbytes: bytearray(nbytes))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return calls


def test_cuda_awareness_detection():
    lib = buffers._mpi_library()
    assert lib is not None and "libmpi" in lib, "mpi4py's MPI library should be found"
    assert buffers._detect_cuda_aware("1", None) is True
    assert buffers._detect_cuda_aware("0", lib) is False
    with pytest.raises(ValueError, match="MPIDP_CUDA_AWARE"):
        buffers._detect_cuda_aware("yes", lib)
    # the mpich wheel answers through MPIX_Query_cuda_support: not CUDA-aware
    assert buffers._detect_cuda_aware(None, lib) is False
    # a library without the query functions, or none at all: assume not aware
    assert buffers._detect_cuda_aware(None, "libc.so.6") is False
    assert buffers._detect_cuda_aware(None, None) is False
    assert buffers._detect_cuda_aware(None, "/nonexistent/libmpi.so") is False


def test_device_round_is_synced_and_staged(fake_cupy, monkeypatch):
    monkeypatch.setattr(buffers, "_cuda_aware", False)
    send = np.arange(4.0).view(FakeDeviceArray)
    recv = np.zeros(4).view(FakeDeviceArray)
    wire, fill, finish = buffers.Stager("auto", ScratchPool())([Send(send, 1), Recv(recv, 1)])
    assert fake_cupy["sync"] == 1, "the stream must be synchronized before MPI reads"
    assert all(type(m.buf) is np.ndarray for m in wire), "MPI must get host copies"
    fill()  # `post` calls it once the receives are posted
    assert np.array_equal(wire[0].buf, send)  # the send was copied out
    wire[1].buf[...] = 7.0  # what MPI would receive
    finish()
    assert np.array_equal(np.asarray(recv), [7.0] * 4)  # copied back to the device


def test_staged_sends_are_copied_out_after_the_receives_are_posted():
    """Incoming data can flow while the sends are copied to host memory."""
    log = []

    class Recorder:  # a comm that only records what is posted
        def Irecv(self, buf, source, tag):  # noqa: N802
            log.append("Irecv")
            return MPI.REQUEST_NULL

        def Isend(self, buf, dest, tag):  # noqa: N802
            log.append("Isend")
            return MPI.REQUEST_NULL

    send, recv = np.arange(3.0), np.zeros(3)
    wire, fill, finish = buffers.Stager("all", ScratchPool())([Send(send, 0), Recv(recv, 0)])

    def traced_fill():
        log.append("copy sends out")
        fill()

    schedule.post(Recorder(), wire, 7, traced_fill)
    assert log == ["Irecv", "copy sends out", "Isend"]
    assert np.array_equal(wire[0].buf, send)
    finish()


def test_cuda_aware_mpi_gets_device_buffers_after_a_sync(fake_cupy, monkeypatch):
    monkeypatch.setattr(buffers, "_cuda_aware", True)
    dev = np.ones(3).view(FakeDeviceArray)
    round_ = [Send(dev, 0)]
    wire, fill, finish = buffers.Stager("auto", ScratchPool())(round_)
    assert wire is round_ and fill is None and finish is None
    assert fake_cupy["sync"] == 1


def test_host_rounds_take_the_fast_path():
    pool = ScratchPool()
    assert buffers.stager(np.ones(2), pool) is None  # NumPy buffers: no stager at all
    round_ = [Send(np.ones(2), 0), Recv(np.ones(2), 0)]
    assert buffers.Stager("auto", pool)(round_) == (round_, None, None)
    buffers.set_staging("1")  # MPIDP_STAGING=1
    try:
        wire, fill, finish = buffers.stager(np.ones(2), pool)(round_)
    finally:
        buffers.set_staging("")
    assert wire is not round_ and fill is not None and finish is not None


def check_staged_collectives_match_mpi(comm):
    """MPIDP_STAGING=1: every message goes through host staging buffers."""
    buffers.set_staging("1")  # what MPIDP_STAGING=1 does at import
    n, rank = comm.Get_size(), comm.Get_rank()
    pool = state(comm).pool
    pool.clear()
    for count in (0, 1, n + 1, 1000):
        x = np.arange(count, dtype=np.float64) * (rank + 1)
        want = np.empty_like(x)
        comm.Allreduce(x, want)
        for algorithm in mpidp.ALGORITHMS["allreduce"]:
            y = np.empty_like(x)
            mpidp.allreduce(comm, x, y, algorithm=algorithm)
            assert np.array_equal(y, want), (algorithm, count)
            z = x.copy()
            mpidp.iallreduce(comm, mpidp.IN_PLACE, z, algorithm=algorithm).wait()
            assert np.array_equal(z, want), (algorithm, count)
        b = np.arange(count, dtype=np.int32) if rank == 0 else np.zeros(count, np.int32)
        mpidp.bcast(comm, b, root=0)
        assert np.array_equal(b, np.arange(count, dtype=np.int32))
    if n > 1:
        assert pool.nbytes() > 0 and any(key[0] == "host" for key in pool._free), \
            "the staging path was not taken"
    buffers.set_staging("")


@needs_gpu("CuPy and a CUDA device")
@pytest.mark.mpi(ranks=[4], timeout=120)
def test_cupy_collectives_match_mpi(mpi_ranks):
    """N = 1..4 in one launch (a communicator of each size: tests/helpers/subcomms.py)."""
    on_each_size(range(1, 5), check_cupy_collectives_match_mpi)


def check_cupy_collectives_match_mpi(comm):
    import cupy as cp

    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    for count in (0, 1, 7, 100_003):
        x = cp.arange(count, dtype=cp.float64) * (comm.rank + 1)
        want = np.empty(count)
        comm.Allreduce(cp.asnumpy(x), want)
        for algorithm in mpidp.ALGORITHMS["allreduce"]:
            y = cp.empty_like(x)
            mpidp.allreduce(comm, x, y, algorithm=algorithm)
            assert np.array_equal(cp.asnumpy(y), want), (algorithm, count)


@pytest.mark.mpi(ranks=[5], timeout=90)
def test_staged_collectives_match_mpi(mpi_ranks):
    """N = 1, 2, 3, 5 in one launch (a communicator of each size: tests/helpers/subcomms.py)."""
    try:
        on_each_size((1, 2, 3, 5), check_staged_collectives_match_mpi)
    finally:
        buffers.set_staging("")


def test_scratch_pool_reuses_buffers_of_the_same_size():
    pool = ScratchPool()
    like = np.zeros(1, np.float32)
    a = pool.take(like, 100)
    pool.give(a)
    assert pool.take(like, 100) is a  # reused, not reallocated
    b = pool.take(like, 100)
    assert b is not a  # two collectives in flight get two buffers
    assert pool.take(np.zeros(1, np.float64), 100).dtype == np.float64
