"""Tensors as NumPy arrays for mpidp's collectives, and torch's reduce ops as mpidp's.

A contiguous CPU tensor becomes an array that shares its memory (``Tensor.numpy()``),
so the result lands in the tensor with no copy; a CUDA tensor becomes a CuPy array on
the same memory (DLPack: ``cupy.from_dlpack``), which mpidp's collectives take as any
CuPy array (CUDA-aware MPI, or staged through host memory), after torch's current
stream has finished writing it. A non-contiguous one is copied into a
contiguous staging tensor, and the result is copied back when the collective is done
(`Staged.finish`). Zero-size tensors are arrays of size 0.

NumPy has no bfloat16: a bfloat16 tensor travels as its 16-bit words (``uint16``), and
its reductions are torch's own bfloat16 kernels on those words (`TorchOp`: each
addition in float32, rounded to nearest-even back to bfloat16, the rounding gloo's
bfloat16 sum does at each step). float16 travels and reduces as NumPy's float16 (each
addition in float32, rounded back). Booleans reduce as gloo reduces them: SUM and MAX
are OR, PRODUCT and MIN are AND.

Also here, what the group's methods share about buffers: `apart` (a send buffer that
overlaps the receive buffer: IN_PLACE or a copy), `offsets`, `finish_all`, `calls`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..arrays import array_module, is_device
from ..collectives.algorithms import ops
from ..collectives.algorithms.ops import Op
from ..collectives.plans import IN_PLACE

R = dist.ReduceOp.RedOpType
_NAMES = {R.SUM: "SUM", R.AVG: "AVG", R.PRODUCT: "PRODUCT", R.MIN: "MIN", R.MAX: "MAX",
          R.BAND: "BAND", R.BOR: "BOR", R.BXOR: "BXOR", R.PREMUL_SUM: "PREMUL_SUM"}
_NUMERIC = {R.SUM: ops.SUM, R.AVG: ops.AVG, R.PRODUCT: ops.PROD, R.MIN: ops.MIN,
            R.MAX: ops.MAX, R.BAND: ops.BAND, R.BOR: ops.BOR, R.BXOR: ops.BXOR}
_BOOL = {R.SUM: ops.LOR, R.MAX: ops.LOR, R.PRODUCT: ops.LAND, R.MIN: ops.LAND,
         R.BAND: ops.LAND, R.BOR: ops.LOR, R.BXOR: ops.LXOR}
_BITWISE = (R.BAND, R.BOR, R.BXOR)


class TorchOp(Op):
    """An mpidp `Op` on bfloat16 words (uint16 arrays): torch's kernel on a bfloat16 view."""

    def __call__(self, acc, tmp, src=None) -> None:
        a = _bf16(acc)
        getattr(torch, self.ufunc)(a if src is None else _bf16(src), _bf16(tmp), out=a)

    def finish(self, block, n: int) -> None:
        if self.divide and n > 1:
            _bf16(block).div_(n)


def _bf16(words) -> torch.Tensor:
    """The bfloat16 tensor on the memory of `words` (a NumPy or CuPy uint16 array)."""
    tensor = torch.from_dlpack(words) if is_device(words) else torch.from_numpy(words)
    return tensor.view(torch.bfloat16)


# names that NumPy and torch share (torch.add, torch.multiply, ...), on the words' kind "u"
_BF16 = {R.SUM: TorchOp("bf16_sum", "add", "u"),
         R.AVG: TorchOp("bf16_avg", "add", "u", divide=True),
         R.PRODUCT: TorchOp("bf16_prod", "multiply", "u"),
         R.MIN: TorchOp("bf16_min", "minimum", "u"),
         R.MAX: TorchOp("bf16_max", "maximum", "u")}


def op_name(reduce_op) -> str:
    """torch's name of a ReduceOp (``"SUM"``) or of its RedOpType."""
    kind = getattr(reduce_op, "op", reduce_op)
    return _NAMES.get(kind, str(kind))


def mpidp_op(reduce_op, dtype: torch.dtype) -> Op:
    """The mpidp `Op` that computes torch's `reduce_op` on tensors of `dtype`.

    ValueError naming the op and dtype where gloo refuses the pair too (AVG on integers,
    bitwise ops on floats) or where mpidp has no such op (PREMUL_SUM).
    """
    kind = reduce_op if isinstance(reduce_op, R) else _red_op_type(reduce_op)
    if dtype == torch.bool:
        table = _BOOL
    elif dtype == torch.bfloat16:
        table = _BF16
    else:
        table = _NUMERIC
    op = table.get(kind)
    floating = dtype.is_floating_point
    if op is None or (kind == R.AVG and not floating) or (kind in _BITWISE and floating):
        raise ValueError(f"mpidp backend: ReduceOp.{op_name(kind)} is not supported on "
                         f"{dtype} tensors")
    return op


def _red_op_type(reduce_op) -> R:
    for kind in _NAMES:
        if reduce_op == kind:
            return kind
    raise ValueError(f"mpidp backend: ReduceOp {reduce_op!r} is not supported")


def check(tensor: torch.Tensor, what: str) -> None:
    """TypeError unless `tensor` is a dense CPU or CUDA tensor of a dtype mpidp carries
    (CUDA: CuPy must be installed, as for mpidp's own device arrays)."""
    if tensor.device.type == "cuda":
        try:
            import cupy  # noqa: F401 - only its presence is checked here
        except ImportError:
            raise TypeError(f"mpidp backend: {what} got a tensor on {tensor.device}; CUDA "
                            f"tensors need CuPy (pip install cupy-cuda12x)") from None
    elif tensor.device.type != "cpu":
        raise TypeError(f"mpidp backend: {what} got a tensor on {tensor.device}; this "
                        f"backend takes CPU and CUDA tensors")
    if tensor.layout != torch.strided:
        raise TypeError(f"mpidp backend: {what} got a {tensor.layout} tensor; this "
                        f"backend takes dense tensors")
    if tensor.dtype.is_complex or tensor.dtype not in _CARRIED:
        raise TypeError(f"mpidp backend: {what} does not support {tensor.dtype} tensors")


_CARRIED = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
            torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def words(tensor: torch.Tensor):
    """The 1-D array that shares a contiguous tensor's memory (bfloat16: uint16): NumPy's
    for a CPU tensor, CuPy's for a CUDA one (once torch's stream is done with it)."""
    flat = tensor.detach().reshape(-1)
    if tensor.dtype == torch.bfloat16:
        flat = flat.view(torch.uint16)
    if flat.is_cuda:
        import cupy

        torch.cuda.current_stream(flat.device).synchronize()  # its values are written
        return cupy.from_dlpack(flat)
    return flat.numpy()


@dataclass
class Staged:
    """A tensor as an array mpidp may write into: its own memory where it is contiguous,
    else a contiguous copy that `finish` writes back."""

    tensor: torch.Tensor
    staging: torch.Tensor | None
    array: np.ndarray

    def finish(self) -> None:
        if self.staging is not None:
            self.tensor.copy_(self.staging.view(self.tensor.shape))


def staged(tensor: torch.Tensor, copy_in: bool = True) -> Staged:
    """`tensor` as a 1-D array for a collective (see `Staged`); `copy_in`: the collective
    reads the tensor's values (False: it only writes them)."""
    if tensor.is_contiguous():
        return Staged(tensor, None, words(tensor))
    staging = (tensor.detach().contiguous() if copy_in
               else torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device))
    return Staged(tensor, staging, words(staging))


def on_host(tensor: torch.Tensor, copy_in: bool = True) -> Staged:
    """`staged`, but always in host memory: what mpi4py's own ``Isend``/``Irecv`` take
    from a CUDA tensor where the MPI library may not be CUDA-aware (mpidp's collectives
    decide that themselves; point-to-point calls go to MPI directly)."""
    if not tensor.is_cuda:
        return staged(tensor, copy_in)
    staging = (tensor.detach().to("cpu").contiguous() if copy_in
               else torch.empty(tensor.shape, dtype=tensor.dtype))
    return Staged(tensor, staging, words(staging))


def apart(send: np.ndarray, recv: np.ndarray, rank: int | None):
    """`send`, or IN_PLACE where it is rank `rank`'s block of `recv` (FSDP2 gathers so),
    or a copy where it overlaps `recv` otherwise (MPI forbids overlapping buffers)."""
    xp = array_module(send)
    if not xp.shares_memory(send, recv):
        return send
    if rank is not None and send.size and send.size * (recv.size // send.size) == recv.size:
        block = recv[rank * send.size:(rank + 1) * send.size]
        if _address(block) == _address(send):
            return IN_PLACE
    return send.copy()


def _address(arr) -> int:
    return arr.data.ptr if is_device(arr) else arr.__array_interface__["data"][0]


def offsets(tensors) -> list[int]:
    """Where each tensor starts in the tensors laid end to end (in elements)."""
    out, at = [], 0
    for t in tensors:
        out.append(at)
        at += t.numel()
    return out


def finish_all(parts):
    """One call that writes back every staged part (None: nothing was staged)."""
    staged_parts = [p for p in parts if p.staging is not None]
    if not staged_parts:
        return None
    return calls([p.finish for p in staged_parts])


def calls(functions):
    """One call that makes each of `functions`' calls in turn."""
    functions = list(functions)

    def run():
        for f in functions:
            f()
    return run
