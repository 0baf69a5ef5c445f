"""The differential test body: one collective call, on the MPI library's communicator and on
mpidp.Comm, with identical inputs and every buffer kind that mpi4py accepts.

`run_case(comm, case)` builds this rank's input from (case, rank), wraps it in the
buffer spec of `case.form`, calls the collective on `comm` (blocking; or the
I-form completed by ``Wait()`` or by polling ``Test()``; or the persistent
``*_init`` form, started and waited for) and returns the user's buffers whole:
the padding around the message and the parts outside the result included.
`check_against_native` runs each case on the MPI library's communicator (the oracle:
``MPI.COMM_WORLD`` or a communicator of a given size split off it), then on
`mpidp.Comm`, and compares. Byte for byte by default: the data are small integers
in every dtype, so the order in which a reduction combines them cannot change a
bit; to the summation-order tolerance for random floats (``Case.floats``). Where
mpi4py raises, mpidp.Comm must raise the same exception type.

One part is compared with the input rather than with MPI: recvbuf past this rank's
block after an in-place reduce-scatter, which MPI leaves undefined. mpidp leaves it
as it was, as MPICH (below 512 KiB) and Open MPI (nearly always) do (docs/dropin.md).
"""

from __future__ import annotations

import array
import os
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

import mpidp
from helpers.dlpackbuf import Exported, NumpyProducer

PAD = 2  # items of padding around the data in the count/displacement forms
SENTINEL = 77  # initial value of everything a collective must not (or did not yet) write
FORMS = ("array", "typed", "count", "displ", "displ4", "memoryview", "array.array", "bytearray",
         "bytes", "fortran", "code", "dlpack", "dlpack0", "dlpack_bytes")
# mpi4py refuses these as a receive buffer (strided: as any buffer); so must mpidp.Comm.
# Bcast makes only the root's buffer read-only: mpi4py takes it, and so must mpidp.Comm.
REFUSED = ("strided", "readonly", "dlpack_readonly")
EXPORTS: list[Exported] = []  # every DLPack producer made, to check their deleters at the end
IN_PLACE = {True: MPI.IN_PLACE, "None": None}  # Case.in_place -> the sendbuf passed


@dataclass
class Case:
    collective: str  # Allreduce, Reduce_scatter_block, Reduce_scatter, Allgather, Allgatherv, Bcast
    count: int  # items per rank (Allreduce: the vector; *scatter*/Allgather: one block)
    dtype: str = "f8"
    op: str = "SUM"  # the name of an MPI.Op
    form: str = "array"
    in_place: bool | str = False  # True: sendbuf=MPI.IN_PLACE; "None": sendbuf=None
    mode: str = "blocking"  # "Wait", "Test": the I-form; "init": persistent; "start": caller
    root: int = 0
    seed: int = 0
    layout: str = "packed"  # Allgatherv recvbuf spec; Reduce_scatter: "given"/"gathered"
    floats: bool = False  # random floats, compared to the summation-order tolerance
    request: object = None  # mode "start": the request of the I-form

    def __str__(self) -> str:
        return (f"{self.collective}(count={self.count}, {self.dtype}, {self.op}, form={self.form},"
                f" in_place={self.in_place}, {self.mode}, root={self.root}, {self.layout}"
                f"{', floats' if self.floats else ''})")


def values(case: Case, count: int, rank: int) -> np.ndarray:
    """This rank's input: small integers, so every reduction is exact in every dtype."""
    rng = np.random.default_rng([case.seed, rank])
    dtype = np.dtype(case.dtype)
    if case.floats:  # positive: sums do not cancel, so a relative tolerance holds
        return rng.uniform(0.5, 1.5, count).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if case.op in ("LAND", "LOR", "LXOR"):
        v = rng.integers(0, 3, count)  # zeros matter to logical ops
    elif case.op in ("BAND", "BOR", "BXOR"):
        v = rng.integers(0, 128, count)
    elif case.op == "PROD":
        v = rng.choice([1, 2] if dtype.kind == "u" else [1, -1, 2], count)
    else:  # sums of up to 8 ranks stay in range: no overflow (Open MPI saturates some)
        top = min(50, np.iinfo(dtype).max // 8) if dtype.kind in "iu" else 50
        v = rng.integers(0 if dtype.kind == "u" else -top, top, count)
    if dtype.kind == "c":
        imag = rng.choice([0, 1], count) if case.op == "PROD" else rng.integers(-5, 5, count)
        v = v + 1j * imag
    return v.astype(dtype)


def supports(form: str, dtype: str) -> bool:
    """Can `form` hold `dtype` (array.array has no bool or complex type code)?"""
    return form != "array.array" or np.dtype(dtype).char in "bBhHiIlLqQfd"


def make(form: str, data: np.ndarray, count: int | None = None):
    """A buffer spec of `form` holding `data`; returns (spec, the user's buffer behind it).

    `count` is the count the spec states, where it states one (per block for an
    Allgather recvbuf or a Reduce_scatter_block sendbuf; default: all of data).
    """
    count = data.size if count is None else count
    mpi_type = MPI.Datatype.fromcode(data.dtype.char)  # MPI.DOUBLE, ...
    pad = np.full(PAD, SENTINEL).astype(data.dtype)
    if form == "typed":
        return [data, mpi_type], data
    if form == "code":
        return [data, mpi_type.tocode()], data
    if form == "count":  # the buffer is longer than the message
        buf = np.concatenate([data, pad])
        return [buf, count, mpi_type], buf
    if form in ("displ", "displ4"):  # the message starts PAD items into the buffer
        buf = np.concatenate([pad, data, pad])
        return ([buf, (count, PAD), mpi_type] if form == "displ" else
                [buf, count, PAD, mpi_type]), buf
    if form == "memoryview":
        return memoryview(data), data
    if form == "array.array" and supports(form, data.dtype.str):
        buf = array.array(data.dtype.char, data.tobytes())
        return buf, buf
    if form in ("bytes", "bytearray"):  # raw bytes, reinterpreted through the datatype
        buf = data.view(np.uint8) if form == "bytes" else bytearray(data.tobytes())
        return [buf, mpi_type], buf
    if form == "fortran" and data.size % 2 == 0:
        buf = np.empty((2, data.size // 2), data.dtype, order="F")
        buf.reshape(-1, order="F")[...] = data
        return buf, buf
    if form.startswith("dlpack") and form != "dlpack_readonly":  # a user's DLPack producer
        raw = form == "dlpack_bytes"
        EXPORTS.append(Exported(data.view(np.uint8) if raw else data,
                                versioned=form != "dlpack0", tied=form == "dlpack"))
        return ([EXPORTS[-1], mpi_type] if raw else EXPORTS[-1]), data
    if form == "strided":  # every other item: mpi4py needs contiguous memory
        buf = np.zeros(2 * data.size, data.dtype)[::2]
        buf[...] = data
        return buf, buf.base
    if form in ("readonly", "dlpack_readonly"):
        data.flags.writeable = False  # NumPy's own producer sets the DLPack read-only flag
        return (data if form == "readonly" else NumpyProducer(data)), data
    return data, data


def snap(obj, itemsize: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """A copy of the bytes of a user's buffer object, in memory order, from item `start`
    to item `stop` (items of `itemsize` bytes, whatever the object's own format)."""
    raw = np.asarray(memoryview(obj)).reshape(-1, order="A").view(np.uint8)
    return raw[start * itemsize : None if stop is None else stop * itemsize].copy()


def call(comm, case: Case, *args, **kwargs) -> None:
    """The blocking collective, its I-form (Wait() or polling Test()), or its *_init form."""
    name = case.collective
    if case.mode == "blocking":
        getattr(comm, name)(*args, **kwargs)
        return
    if case.mode == "init":
        request = getattr(comm, name + "_init")(*args, **kwargs)
        request.Start()
        request.Wait()
        request.Free()
        return
    request = getattr(comm, "I" + name[0].lower() + name[1:])(*args, **kwargs)
    if case.mode == "start":  # the caller completes it
        case.request = request
    elif case.mode == "Wait":
        assert request.Wait() is True
    else:
        while not request.Test():
            os.sched_yield()  # ranks share cores: a rank that spins starves its peers


def run_case(comm, case: Case) -> list[tuple]:
    """THE test body: run `case` on `comm`; return its user buffers as (obj, start, stop),
    or (obj, start, stop, expected) for a part that must come out as it went in."""
    n, rank = comm.Get_size(), comm.Get_rank()
    k, dtype = case.count, np.dtype(case.dtype)
    empty = lambda size: np.full(size, SENTINEL).astype(dtype)  # noqa: E731
    c = case.collective
    if c == "Allreduce":
        data = values(case, k, rank)
        if case.in_place:
            spec, buf = make(case.form, data)
            call(comm, case, IN_PLACE[case.in_place], spec, op=getattr(MPI, case.op))
            return [(buf, 0, None)]
        sspec, sbuf = make(case.form, data)
        rspec, rbuf = make(case.form, empty(k))
        call(comm, case, sspec, rspec, op=getattr(MPI, case.op))
        return [(sbuf, 0, None), (rbuf, 0, None)]
    if c in ("Reduce_scatter_block", "Reduce_scatter"):
        counts = ([k] * n if c == "Reduce_scatter_block" else
                  [(r * 5 + k) % (k + 2) for r in range(n)])  # uneven, some zero
        mine, data = counts[rank], values(case, sum(counts), rank)
        args = () if c == "Reduce_scatter_block" else (
            None if case.layout == "gathered" and not case.in_place else counts,)
        if case.in_place:  # the result at the front, the rest as it was
            spec, buf = make(case.form, data, count=k if c == "Reduce_scatter_block" else None)
            call(comm, case, IN_PLACE[case.in_place], spec, *args, op=getattr(MPI, case.op))
            start = PAD if case.form.startswith("displ") else 0
            end = start + sum(counts)
            return [(buf, 0, start + mine), (buf, start + mine, end, data[mine:]),
                    (buf, end, None)]
        sspec, sbuf = make(case.form, data, count=k if c == "Reduce_scatter_block" else None)
        rspec, rbuf = make(case.form, empty(mine))
        call(comm, case, sspec, rspec, *args, op=getattr(MPI, case.op))
        return [(sbuf, 0, None), (rbuf, 0, None)]
    if c == "Allgather":
        if case.in_place:
            full = empty(n * k)
            full[rank * k : (rank + 1) * k] = values(case, k, rank)
            spec, buf = make(case.form, full, count=k)
            call(comm, case, IN_PLACE[case.in_place], spec)
            return [(buf, 0, None)]
        sspec, sbuf = make(case.form, values(case, k, rank))
        rspec, rbuf = make(case.form, empty(n * k), count=k)
        call(comm, case, sspec, rspec)
        return [(sbuf, 0, None), (rbuf, 0, None)]
    if c == "Allgatherv":
        return run_allgatherv(comm, case)
    if c == "Bcast":
        data = values(case, k, case.root) if rank == case.root else empty(k)
        form = case.form  # read-only: the root's buffer alone, which MPI only reads
        if rank != case.root and form in ("readonly", "dlpack_readonly"):
            form = "array"
        spec, buf = make(form, data)
        call(comm, case, spec, root=case.root)
        return [(buf, 0, None)]
    raise AssertionError(c)


def run_allgatherv(comm, case: Case) -> list[tuple]:
    """Allgatherv with the recvbuf spec forms of mpi4py's message_vector."""
    n, rank = comm.Get_size(), comm.Get_rank()
    k, dtype = case.count, np.dtype(case.dtype)
    mpi_type = MPI.Datatype.fromcode(dtype.char)
    counts = [(r * 3 + k) % (k + 2) for r in range(n)]  # uneven, some zero
    if case.layout in ("equal", "strided"):
        counts = [k] * n
    displs = [sum(counts[:r]) for r in range(n)]
    if case.layout == "reversed":  # blocks in reverse rank order, with gaps
        displs = [sum(c + 1 for c in counts[r + 1 :]) for r in range(n)]
    if case.layout == "strided":
        displs = [(k + 1) * r for r in range(n)]
    if case.layout == "inferred":  # no counts: mpi4py splits the buffer evenly
        base, extra = divmod(n * k + n // 2, n)
        counts = [base + (r < extra) for r in range(n)]
        displs = [sum(counts[:r]) for r in range(n)]
    size = max((d + c for d, c in zip(displs, counts, strict=True)), default=0) + PAD
    recv = np.full(size, SENTINEL).astype(dtype)
    mine = values(case, counts[rank], rank)
    if case.in_place:
        recv[displs[rank] : displs[rank] + counts[rank]] = mine
    spec = {
        "packed": [recv, counts, mpi_type],
        "listed": [recv, counts, displs, mpi_type],
        "reversed": [recv, (counts, displs), mpi_type],
        "untyped": [recv, (counts, displs)],
        "equal": [recv, k, mpi_type],
        "strided": [recv, (k, k + 1), mpi_type],
        "inferred": recv[: sum(counts)],
    }[case.layout]
    send, sbuf = (IN_PLACE[case.in_place], mine) if case.in_place else make(case.form, mine)
    call(comm, case, send, spec)
    return [(recv, 0, None), (sbuf, 0, None)]


def results(parts: list[tuple], case: Case) -> list[tuple]:
    """`run_case`'s buffers, once complete, as (bytes, expected bytes or None) pairs."""
    size = np.dtype(case.dtype).itemsize
    return [(snap(p[0], size, *p[1:3]), p[3].view(np.uint8) if len(p) > 3 else None)
            for p in parts]


def outcome(comm, case: Case):
    """(`results`, None), or (None, the exception the call raised)."""
    try:
        return results(run_case(comm, case), case), None
    except Exception as e:  # compared with the MPI library's own
        return None, e


def check_against_native(cases: list[Case], algorithm_key: str, all_algorithms=(),
                         world=None) -> None:
    """Run every case on the native comm `world` (default ``MPI.COMM_WORLD``), then on
    mpidp.Comm over it (every algorithm for the cases in `all_algorithms`, else "auto");
    the buffers, or the exception types, must match."""
    world = MPI.COMM_WORLD if world is None else world
    n, rank = world.Get_size(), world.Get_rank()
    for i, case in enumerate(cases):
        case.seed = i
        expected, error = outcome(world, case)
        assert not isinstance(error, MPI.Exception), f"{case}: MPI itself failed: {error}"
        names = mpidp.ALGORITHMS[algorithm_key] if i in all_algorithms else ("auto",)
        for name in names:
            comm = mpidp.Comm(world, algorithm={algorithm_key: name})
            got, mine = outcome(comm, case)
            where = f"rank {rank} of {n}, algorithm {name!r}, {case}"
            if error is not None or mine is not None:
                assert type(mine) is type(error), f"{where}: mpidp {mine!r}, mpi4py {error!r}"
                continue
            for (g, keep), (e, _) in zip(got, expected, strict=True):
                want = e if keep is None else keep  # keep: the input, unchanged
                assert same(g, want, case, n), f"{where}:\n mpidp  {g}\n expect {want}"


def same(got: np.ndarray, want: np.ndarray, case: Case, n: int) -> bool:
    """Byte for byte; random floats to the summation-order tolerance (n terms)."""
    if got.nbytes != want.nbytes:
        return False
    if not case.floats:
        return np.array_equal(got.view(np.uint8), want.view(np.uint8))
    dtype = np.dtype(case.dtype)
    got, want = got.view(np.uint8).view(dtype), want.view(np.uint8).view(dtype)
    return np.allclose(got, want, rtol=2 * n * np.finfo(dtype).eps, atol=0)
