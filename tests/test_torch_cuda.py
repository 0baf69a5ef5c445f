"""mpidp.torch on CUDA tensors (DLPack to CuPy, then mpidp's device path): each operation
on a CUDA tensor gives the bits the same operation gives on the same values on the CPU
(whose results tests/test_torch.py checks against gloo's). Runs where torch sees a CUDA
device and CuPy is installed (`make gpu-check` on a GPU machine); skipped here otherwise.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the `torch` extra: "
                            "make setup installs it)")
import torch.distributed as dist  # noqa: E402
from helpers.gpu import needs_gpu  # noqa: E402
from helpers.torchgroups import start  # noqa: E402


def values(rank: int, dtype, n: int = 37) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return (torch.randint(-16, 17, (n,), generator=g) / 8).to(dtype)


def on_both(call, *tensors):
    """`call` on CUDA copies of `tensors` and on CPU copies: both results, on the CPU."""
    out = []
    for device in ("cuda", "cpu"):
        ts = [t.clone().to(device) for t in tensors]
        call(*ts)
        torch.cuda.synchronize()
        out.append([t.cpu() for t in ts])
    return out


def check_every_operation_on_cuda_equals_cpu() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = values(rank, dtype)
        cases = {
            "all_reduce": (lambda t: dist.all_reduce(t), x),
            "all_reduce (non-contiguous)": (lambda t: dist.all_reduce(t[::2]), x),
            "broadcast": (lambda t: dist.broadcast(t, n - 1), x),
            "all_gather_into_tensor": (
                lambda out, t: dist.all_gather_into_tensor(out, t),
                torch.zeros(37 * n, dtype=dtype), x),
            "reduce_scatter_tensor": (
                lambda out, t: dist.reduce_scatter_tensor(out, t),
                torch.zeros(5, dtype=dtype), values(rank, dtype, 5 * n)),
        }
        for name, (call, *tensors) in cases.items():
            on_gpu, on_cpu = on_both(call, *tensors)
            for a, b in zip(on_gpu, on_cpu, strict=True):
                assert torch.equal(a, b), f"{name} {dtype}: cuda {a} cpu {b}"
    if n > 1:  # point-to-point: through host memory
        t = values(rank, torch.float32).cuda()
        if rank == 0:
            dist.send(t, 1)
        elif rank == 1:
            got = torch.empty_like(t)
            dist.recv(got, 0)
            assert torch.equal(got.cpu(), values(0, torch.float32))


@needs_gpu("torch with CUDA, CuPy and a CUDA device", torch_too=True)
@pytest.mark.mpi(ranks=[2], timeout=180)
def test_every_operation_on_cuda_tensors_equals_the_cpu_result(mpi_ranks):
    start()
    torch.cuda.set_device(0)
    check_every_operation_on_cuda_equals_cpu()
