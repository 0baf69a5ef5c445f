"""`ProcessGroup`: torch.distributed's collectives on mpidp's, one MPI communicator each.

Each method turns its tensors into NumPy arrays (`tensors.staged`: shared memory where
contiguous), starts mpidp's nonblocking collective on them (`mpidp.iallreduce`,
`ibcast`, `iallgather`, `ireduce_scatter`; point-to-point: mpi4py's ``Isend``/``Irecv``)
and returns a `Work` on the request, which the group's progress thread completes.
The blocking form (``async_op=False``) is torch calling ``wait()`` on that Work.

    dist.all_reduce(t, op)             allreduce          mpidp.iallreduce(IN_PLACE, t)
    all_reduce_coalesced, DDP buckets  allreduce_coalesced  one iallreduce of the packed tensors
    dist.broadcast(t, src)             broadcast          mpidp.ibcast(t, root)
    dist.all_gather(ts, t)             allgather          mpidp.iallgather (per-rank counts)
    dist.all_gather_into_tensor        all_gather_single  mpidp.iallgather into the output
    dist.reduce_scatter(t, ts)         reduce_scatter     mpidp.ireduce_scatter
    dist.reduce_scatter_tensor         reduce_scatter_single
    dist.barrier()                     barrier            a one-byte all-reduce
    dist.send / dist.recv              send / recv        Isend / Irecv, the user's tag

Every other operation raises NotImplementedError naming it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import recorder
from ..collectives import api, cost
from ..collectives.engine.completion import default_timeout
from ..collectives.placement import placement
from ..collectives.plans import IN_PLACE
from ..collectives.state import TAG_BASE, state
from . import tensors as tz
from .options import Options
from .tensors import staged
from .work import InBackward, Progress, Tested, Work


class ProcessGroup(dist.ProcessGroup):
    """A torch process group whose collectives are mpidp's, on the MPI communicator `comm`.

    Args:
        comm: this group's MPI communicator (its ranks in torch's group order).
        timeout: the group's timeout (seconds): a collective not complete by then fails
            (``MPIDP_TIMEOUT``, where it is set and shorter, instead).
        options: `Options`.
    """

    def __init__(self, comm, timeout: float | None = None, options: Options | None = None):
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError("mpidp backend: the progress thread needs MPI_THREAD_MULTIPLE "
                               f"(MPI was initialized with level {MPI.Query_thread()})")
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        if comm.Get_size() > 1:  # learned now, while every member is creating the group:
            placement(comm)  # a collective started later then never waits for a peer
            cost.model(comm)  # before its first message (auto's cost model, calibrated)
        env = default_timeout()  # MPIDP_TIMEOUT, where set and shorter, bounds it too
        self.timeout = timeout if env is None else env if timeout is None else min(timeout, env)
        self.options = options or Options()
        self.progress = Progress(self.options.progress_interval_s)
        self._kw = {"debug": True} if self.options.debug else {}
        self._backward = InBackward()  # which of DDP's buckets an all-reduce is

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "mpidp"

    @property
    def name(self):  # torch reads pg.name() on some paths
        return lambda: "mpidp"

    @property
    def group_name(self) -> str:
        """torch's name of this group (device meshes and FSDP2 look groups up by it)."""
        return dist.distributed_c10d._world.pg_names[self]

    def __repr__(self) -> str:
        return f"<mpidp.torch.ProcessGroup rank {self.rank()} of {self.size()}>"

    def _start(self, requests, result, finish, name: str) -> Work:
        work = Work(requests, result, finish, name, self.timeout)
        if requests:
            self.progress.add(work)
        else:
            work.poll()
        return work

    def _algorithm(self, collective: str) -> str:
        return self.options.for_collective(collective)

    # ------------------------------------------------------------ reductions

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        return self._allreduce(tensors, opts.reduceOp, "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self._allreduce(tensors, opts.reduceOp, "all_reduce_coalesced", pack=True)

    def _allreduce(self, tensors, reduce_op, name: str, pack: bool = False) -> Work:
        for t in tensors:
            tz.check(t, name)
        if pack and len(tensors) > 1:
            if len({t.dtype for t in tensors}) > 1:
                raise TypeError(f"mpidp backend: {name} takes tensors of one dtype")
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
            views = [flat.narrow(0, i, t.numel())
                     for i, t in zip(tz.offsets(tensors), tensors, strict=True)]

            def unpack():
                for t, v in zip(tensors, views, strict=True):
                    t.copy_(v.view(t.shape))
            parts, finish = [tz.staged(flat)], unpack
        else:
            parts = [staged(t) for t in tensors]
            finish = tz.finish_all(parts)
        op = tz.mpidp_op(reduce_op, tensors[0].dtype) if tensors else None
        reqs = [api.iallreduce(self.comm, IN_PLACE, p.array, op=op,
                               algorithm=self._algorithm("allreduce"), **self._kw)
                for p in parts]
        bucket = self._backward.allreduce_started()
        if bucket is not None:  # its site is loss.backward()'s line: say which bucket
            for req in reqs:
                recorder.name_call(state(self.comm).flight, req, f"DDP bucket {bucket}")
        return self._start(reqs, list(tensors), finish, name)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        reqs, finishes = [], []
        for out, inputs in zip(outputs, input_lists, strict=True):
            for t in [out, *inputs]:
                tz.check(t, "reduce_scatter")
            full = torch.cat([t.detach().reshape(-1) for t in inputs])
            reqs.append(self._reduce_scatter(full, out, [t.numel() for t in inputs],
                                             opts.reduceOp, finishes))
        return self._start(reqs, list(outputs), tz.calls(finishes), "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 (torch's name)
        opts = opts or dist.ReduceScatterOptions()
        return self._rs_single([output], [input], opts, "reduce_scatter_tensor")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._rs_single(outputs, inputs, opts, "reduce_scatter_tensor_coalesced")

    def _rs_single(self, outputs, inputs, opts, name: str) -> Work:
        reqs, finishes = [], []
        for out, full in zip(outputs, inputs, strict=True):
            for t in (out, full):
                tz.check(t, name)
            if full.numel() != out.numel() * self.size():
                raise ValueError(f"mpidp backend: {name}: the input has {full.numel()} "
                                 f"elements, not output's {out.numel()} x {self.size()} ranks")
            reqs.append(self._reduce_scatter(full, out, None, opts.reduceOp, finishes))
        return self._start(reqs, list(outputs), tz.calls(finishes), name)

    def _reduce_scatter(self, full, out, counts, reduce_op, finishes):
        op = tz.mpidp_op(reduce_op, full.dtype)
        recv = staged(out, copy_in=False)
        send = tz.apart(tz.staged(full).array, recv.array, None)
        finishes.append(recv.finish)
        return api.ireduce_scatter(self.comm, send, recv.array, counts, op=op,
                                   algorithm=self._algorithm("reduce_scatter"), **self._kw)

    # ------------------------------------------------------------ gathers, broadcast

    def allgather(self, output_lists, inputs, opts=None):
        reqs, finishes = [], []
        for outs, t in zip(output_lists, inputs, strict=True):
            for x in [t, *outs]:
                tz.check(x, "all_gather")
            counts = [o.numel() for o in outs]
            if len(outs) != self.size():
                raise ValueError(f"mpidp backend: all_gather needs {self.size()} output "
                                 f"tensors, not {len(outs)}")
            flat = torch.empty(sum(counts), dtype=t.dtype, device=t.device)
            starts = tz.offsets(outs)

            def unpack(outs=outs, flat=flat, starts=starts):
                for o, s in zip(outs, starts, strict=True):
                    o.copy_(flat.narrow(0, s, o.numel()).view(o.shape))
            finishes.append(unpack)
            reqs.append(api.iallgather(self.comm, staged(t).array, tz.words(flat), counts,
                                       algorithm=self._algorithm("allgather"), **self._kw))
        return self._start(reqs, output_lists, tz.calls(finishes), "all_gather")

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's name)
        return self._ag_single([output], [input], "all_gather_into_tensor")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._ag_single(outputs, inputs, "all_gather_into_tensor_coalesced")

    def _ag_single(self, outputs, inputs, name: str) -> Work:
        reqs, finishes = [], []
        for out, t in zip(outputs, inputs, strict=True):
            for x in (out, t):
                tz.check(x, name)
            if out.numel() != t.numel() * self.size():
                raise ValueError(f"mpidp backend: {name}: the output has {out.numel()} "
                                 f"elements, not input's {t.numel()} x {self.size()} ranks")
            recv = staged(out, copy_in=False)
            finishes.append(recv.finish)
            send = tz.apart(staged(t).array, recv.array, self.rank())
            reqs.append(api.iallgather(self.comm, send, recv.array,
                                       algorithm=self._algorithm("allgather"), **self._kw))
        return self._start(reqs, list(outputs), tz.calls(finishes), name)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        parts = []
        for t in tensors:
            tz.check(t, "broadcast")
            parts.append(staged(t))
        reqs = [api.ibcast(self.comm, p.array, opts.rootRank,
                           algorithm=self._algorithm("bcast"), **self._kw) for p in parts]
        return self._start(reqs, list(tensors), tz.finish_all(parts), "broadcast")

    def barrier(self, opts=None):
        one = np.zeros(1, np.uint8)
        req = api.iallreduce(self.comm, IN_PLACE, one, op="max", **self._kw)
        return self._start([req], [], None, "barrier")

    # ------------------------------------------------------------ point-to-point

    def send(self, tensors, dst: int, tag: int = 0):
        return self._p2p(tensors, dst, tag, "send")

    def recv(self, tensors, src: int, tag: int = 0):
        return self._p2p(tensors, src, tag, "recv")

    def _p2p(self, tensors, peer: int, tag: int, name: str) -> Work:
        if not 0 <= tag < TAG_BASE:
            raise ValueError(f"mpidp backend: {name} tag {tag} is not in 0..{TAG_BASE - 1} "
                             f"(mpidp's collectives use the tags from {TAG_BASE} up)")
        parts = []
        for t in tensors:
            tz.check(t, name)
            parts.append(tz.on_host(t, copy_in=name == "send"))
        post = self.comm.Isend if name == "send" else self.comm.Irecv
        reqs = [Tested(post(p.array, peer, tag)) for p in parts]
        return self._start(reqs, list(tensors), tz.finish_all(parts), name)

    def recv_anysource(self, tensors, tag: int = 0):
        raise _unsupported("recv from any source")

    # ------------------------------------------------------------ what this backend does not do

    def alltoall(self, *args, **kw):
        raise _unsupported("all_to_all")

    def all_to_all_single(self, *args, **kw):
        raise _unsupported("all_to_all_single")

    def alltoall_base(self, *args, **kw):
        raise _unsupported("all_to_all_single")

    def gather(self, *args, **kw):
        raise _unsupported("gather")

    def scatter(self, *args, **kw):
        raise _unsupported("scatter")

    def reduce(self, *args, **kw):
        raise _unsupported("reduce")

    def allgather_coalesced(self, *args, **kw):
        raise _unsupported("all_gather_coalesced")

    def monitored_barrier(self, *args, **kw):
        raise _unsupported("monitored_barrier")

    def shutdown(self) -> None:
        self.progress.close()

    def abort(self) -> None:
        self.progress.close()


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"mpidp backend: {what} is not supported (supported: "
                               "all_reduce, all_reduce_coalesced, broadcast, all_gather, "
                               "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
                               "barrier, send, recv, and the object collectives built on them)")
