"""Tests that need a GPU: where there is none, skipped without launching any ranks.

    @needs_gpu("CuPy and a CUDA device")
    @pytest.mark.mpi(ranks=[4], timeout=120)
    def test_on_the_gpu(mpi_ranks): ...

The MPI plugin launches a test's ranks before any of them reads its skip mark, so a
``skipif`` on a multi-rank test costs a launch (seconds on 2 cores) to skip; `needs_gpu`
puts a plain test that skips, with the reason, in its place instead.
"""

from __future__ import annotations

import pytest


def have_gpu(torch_too: bool = False) -> bool:
    """CuPy sees a CUDA device (and, with `torch_too`, so does torch)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return False
    except Exception:  # noqa: BLE001 - no CuPy, or CuPy without a device or a driver
        return False
    if torch_too:
        try:
            import torch
        except ImportError:
            return False
        return torch.cuda.is_available()
    return True


def needs_gpu(what: str, torch_too: bool = False):
    """The test itself where `have_gpu`, else a test of its name that skips saying so."""
    def decorate(test):
        if have_gpu(torch_too):
            return test

        def skipped():
            pytest.skip(f"needs {what} (none on this machine); `make gpu-check` runs it on a "
                        f"GPU machine")
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):  # not its
            setattr(skipped, name, getattr(test, name))  # signature, nor its marks
        return skipped
    return decorate
