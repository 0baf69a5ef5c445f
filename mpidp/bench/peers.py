"""Other implementations in the same table: ``torch.distributed`` with the gloo backend.

What a Python user on CPUs would otherwise pick. Optional: where PyTorch is not
importable the sweep has no gloo rows and its metadata says ``"gloo": "not
installed"``. The process group is started from MPI: rank and size are the MPI
communicator's, rendezvous ``env://`` on 127.0.0.1 at a port that rank 0 finds
free and broadcasts. The calls run on ``torch.from_numpy`` views of the sweep's
own buffers, so gloo sees the same data and its result is checked against
native like every other row. The sweep times gloo in a pass of its own after
the others (interleaved, gloo's calls slowed every other call: see
docs/benchmarks-notes.md), its speed-up against the first pass's native times;
PyTorch is imported and the process group started only for that pass.

Placement: ``all_reduce`` and ``broadcast`` work in place only, so the
out-of-place all-reduce copies sendbuf into recvbuf first (timed: a user would
have to); ``all_gather_single`` / ``reduce_scatter_single`` (the older
``*_into_tensor`` / ``*_tensor`` names before PyTorch 2.14) take an input and an
output, and in place the input is the output's own block (all-gather) or the
whole output (reduce-scatter), as in MPI.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from functools import partial

import numpy as np

NOT_INSTALLED = "not installed"


def available() -> bool:
    return importlib.util.find_spec("torch") is not None


def describe() -> str:
    """'torch.distributed 2.14.1 (gloo backend)', or 'not installed'; without importing torch."""
    if not available():
        return NOT_INSTALLED
    from importlib.metadata import version

    return f"torch.distributed {version('torch').split('+')[0]} (gloo backend)"


def start_gloo(comm) -> None:
    """Start torch.distributed's gloo process group on comm's ranks (collective over comm)."""
    import torch.distributed as dist

    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:  # a free port now; gloo's store binds it a moment later
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", init_method="env://", rank=comm.Get_rank(),
                            world_size=comm.Get_size())


def stop_gloo() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def gloo_call(case):
    """gloo's form of the case's collective on the case's buffers, arguments bound."""
    import torch
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN}
    t = torch.from_numpy
    recv = t(case.recv)
    if case.collective == "bcast":
        return partial(dist.broadcast, recv, 0)
    if case.collective == "allreduce":
        if case.inplace:
            return partial(dist.all_reduce, recv, op=ops[case.op])

        def copy_then_reduce():  # all_reduce has no out-of-place form
            np.copyto(case.recv, case.send)
            dist.all_reduce(recv, op=ops[case.op])

        return copy_then_reduce
    if case.collective == "allgather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return partial(gather, recv, t(case.block if case.inplace else case.send))
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    send = case.recv if case.inplace else case.send  # in place: the whole vector is in recv
    return partial(scatter, t(case.result), t(send), op=ops[case.op])
