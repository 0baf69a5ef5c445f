"""One collective at one size, as `python -m mpidp.bench collectives` times it.

`Case` holds the buffers and the calls (native, mpidp's algorithms, their persistent
forms) with every argument bound; `time_rows` times them interleaved; `memory` is
what one call allocates, first and steady; `make_row` is the JSON row of one call.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from functools import partial

import numpy as np
from mpi4py import MPI

from .. import collectives as mpidp
from ..collectives import api
from ..collectives.state import state
from .output import bus_factor

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


class Case:
    """The buffers and calls of one collective at one size and placement.

    ``setup()`` builds the expected answer with the native call; ``prepare()``
    restores the input / poisons the output before an iteration; ``native()``
    and ``mpidp(algorithm, **kw)`` return the collective as a call with every
    argument bound; ``wrong()`` counts the items of the output that differ from
    the expected answer.
    """

    def __init__(self, comm, collective: str, count: int, inplace: bool | None,
                 op: str, bufs: dict):
        self.comm, self.collective, self.count, self.inplace = comm, collective, count, inplace
        self.op, self.mpi_op = op, MPI_OPS[op]
        n, rank = comm.Get_size(), comm.Get_rank()
        c, b = count, count // n  # whole vector, one block
        x, out, want = bufs["x"], bufs["out"], bufs["want"]
        self.poison = bufs["poison"]
        if collective == "allreduce":
            self.send, self.recv, self.result = x[:c], out[:c], out[:c]
            self.source = x[:c]  # what `prepare` copies into recv when in place
        elif collective == "reduce_scatter":
            self.send, self.recv = x[:c], (out[:c] if inplace else out[:b])
            self.result, self.source = out[:b], x[:c]
        elif collective == "allgather":
            self.send, self.recv, self.result = x[:b], out[:c], out[:c]
            self.source = x[:b]
            self.block = out[rank * b:(rank + 1) * b]  # where in place keeps its own block
        else:  # bcast: one buffer, the root's input
            self.send, self.recv, self.result, self.source = None, out[:c], out[:c], x[:c]
        self.want = want[: self.result.size]

    def prepare(self) -> None:
        """Fresh input, poisoned output: a collective that skips a write is caught."""
        recv = self.recv
        if self.collective == "bcast":
            if self.comm.Get_rank() == 0:
                np.copyto(recv, self.source)
            else:
                recv.fill(self.poison)
        elif not self.inplace:
            recv.fill(self.poison)
        elif self.collective == "allgather":
            recv.fill(self.poison)
            np.copyto(self.block, self.source)
        else:
            np.copyto(recv, self.source)

    def native(self):
        """The MPI library's call, arguments bound now (no work of ours inside the timing)."""
        comm, send = self.comm, (MPI.IN_PLACE if self.inplace else self.send)
        if self.collective == "allreduce":
            return partial(comm.Allreduce, send, self.recv, op=self.mpi_op)
        if self.collective == "reduce_scatter":
            return partial(comm.Reduce_scatter_block, send, self.recv, op=self.mpi_op)
        if self.collective == "allgather":
            return partial(comm.Allgather, send, self.recv)
        return partial(comm.Bcast, self.recv, root=0)

    def mpidp(self, algorithm: str, **kw):
        """mpidp's entry point for this collective, arguments bound."""
        comm, send = self.comm, (api.IN_PLACE if self.inplace else self.send)
        if self.collective == "allreduce":
            return partial(api.allreduce, comm, send, self.recv, op=self.op,
                           algorithm=algorithm, **kw)
        if self.collective == "reduce_scatter":
            return partial(api.reduce_scatter, comm, send, self.recv, op=self.op,
                           algorithm=algorithm, **kw)
        if self.collective == "allgather":
            return partial(api.allgather, comm, send, self.recv, algorithm=algorithm, **kw)
        return partial(api.bcast, comm, self.recv, 0, algorithm=algorithm, **kw)

    def persistent(self, native: bool):
        """The persistent form (``*_init``), planned now; (the call: start + wait, its free)."""
        comm = self.comm
        inplace = MPI.IN_PLACE if native else api.IN_PLACE
        send = inplace if self.inplace else self.send
        if native:
            make = {"allreduce": lambda: comm.Allreduce_init(send, self.recv, op=self.mpi_op),
                    "reduce_scatter": lambda: comm.Reduce_scatter_block_init(
                        send, self.recv, op=self.mpi_op),
                    "allgather": lambda: comm.Allgather_init(send, self.recv),
                    "bcast": lambda: comm.Bcast_init(self.recv, root=0)}[self.collective]
        else:
            make = {"allreduce": lambda: mpidp.allreduce_init(comm, send, self.recv, op=self.op),
                    "reduce_scatter": lambda: mpidp.reduce_scatter_block_init(
                        comm, send, self.recv, op=self.op),
                    "allgather": lambda: mpidp.allgather_init(comm, send, self.recv),
                    "bcast": lambda: mpidp.bcast_init(comm, self.recv, 0)}[self.collective]
        req = make()

        def call():
            req.Start()
            req.Wait()

        return call, req.Free

    def setup(self) -> None:
        self.prepare()
        self.native()()
        np.copyto(self.want, self.result)

    def wrong(self) -> int:
        return int(np.count_nonzero(self.result != self.want))


def time_rows(case: Case, calls: dict, warmup: int, iters: int) -> dict:
    """{name: (per-iteration times, the slowest rank's; wrong items over all ranks)}.

    Interleaved: iteration i runs every call once, native included, so that a
    disturbance lasting a while (another process taking a core for a few ms)
    slows every algorithm of the row alike instead of one of them. The order
    rotates by one each iteration, so that each call follows each other one
    equally often: a call leaves caches and pages in a state that the next pays for.
    """
    comm = case.comm
    times = {name: np.zeros(iters) for name in calls}
    wrong = dict.fromkeys(calls, 0)
    names = list(calls)
    for i in range(warmup + iters):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            call = calls[name]
            case.prepare()
            comm.Barrier()
            t0 = time.perf_counter()
            call()
            t = time.perf_counter() - t0
            wrong[name] += case.wrong()
            if i >= warmup:
                times[name][i - warmup] = t
    out = {}
    for name in calls:
        comm.Allreduce(MPI.IN_PLACE, times[name], op=MPI.MAX)  # as long as the slowest rank
        out[name] = (times[name].tolist(), comm.allreduce(wrong[name], op=MPI.SUM))
    return out


def peak_memory(case: Case, call) -> int:
    """Largest new allocation (bytes, max over ranks) traced during one call."""
    case.prepare()
    case.comm.Barrier()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    call()
    peak = tracemalloc.get_traced_memory()[1] - base
    return case.comm.allreduce(peak, op=MPI.MAX)


def memory(case: Case, algorithm: str) -> dict:
    """First-call (empty pool) and steady-state (warm pool) peak allocation of one call."""
    tracemalloc.start()
    try:
        steady = peak_memory(case, case.mpidp(algorithm))
        state(case.comm).pool.clear()  # the first call of a fresh communicator
        first = peak_memory(case, case.mpidp(algorithm))
    finally:
        tracemalloc.stop()
    if case.wrong():
        raise RuntimeError(f"{case.collective} {algorithm}: wrong result in the memory pass")
    return {"mem_first_bytes": first, "mem_steady_bytes": steady}


def make_row(collective, algorithm, resolved, inplace, count, dtype, n, times, wrong,
             warmup, persistent: bool = False) -> dict:
    nbytes = count * dtype.itemsize
    med, best = statistics.median(times), min(times)
    algbw = nbytes / med / 1e9 if med > 0 else 0.0
    return {"collective": collective, "algorithm": algorithm, "resolved": resolved,
            "inplace": inplace, "bytes": nbytes, "count": count, "dtype": str(dtype),
            "ranks": n, "iters": len(times), "warmup": warmup,
            "time_us": med * 1e6, "min_us": best * 1e6, "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(collective, n), "wrong": wrong,
            "persistent": persistent}
