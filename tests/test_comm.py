"""mpidp.Comm is a drop-in for an mpi4py communicator: one test body, two communicators.

Every case runs first on ``MPI.COMM_WORLD`` (the MPI library's collectives: the
oracle), then on ``mpidp.Comm(MPI.COMM_WORLD, algorithm=...)`` for every algorithm
that `mpidp.ALGORITHMS` lists for the collective, read when the test runs. The
user's buffers, send and receive, padding included, must come out identical.
Data are small integers (in every dtype), so sums and products are exact and
the order in which an algorithm combines them cannot change a bit. The body is
tests/helpers/differential.py; here it sweeps dtypes, ops, counts and algorithms on 1-8
ranks, and test_bufspec.py sweeps the buffer kinds. Every rank count runs in one launch of
8 ranks, on a communicator of each size split off COMM_WORLD (tests/helpers/subcomms.py):
the MPI library's collectives on that communicator are the oracle.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers.comms import NoCollectives
from helpers.differential import FORMS, Case, check_against_native, results, run_case
from helpers.subcomms import on_each_size
from helpers.sweeps import debug_check_off
from mpi4py import MPI

import mpidp
from mpidp.collectives.dropin.comm import Request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = range(1, 9)

# every (dtype, op) pair MPI defines, once each
DTYPE_OPS = [
    ("f8", "SUM"), ("f4", "SUM"), ("i4", "SUM"), ("i8", "SUM"), ("u1", "SUM"),
    ("i1", "SUM"), ("i2", "SUM"), ("u8", "SUM"), ("c16", "SUM"), ("c8", "SUM"),
    ("f8", "PROD"), ("f4", "PROD"), ("i4", "PROD"), ("u2", "PROD"), ("c16", "PROD"),
    ("f8", "MAX"), ("i4", "MAX"), ("u2", "MAX"), ("i1", "MAX"),
    ("f4", "MIN"), ("i8", "MIN"), ("u1", "MIN"),
    ("?", "LAND"), ("?", "LOR"), ("?", "LXOR"), ("i4", "LAND"), ("u1", "LOR"),
    ("i2", "LXOR"), ("i4", "BAND"), ("u1", "BOR"), ("i8", "BXOR"), ("u4", "BXOR"),
]
MODES = ("blocking", "Wait", "Test")


def counts_for(n: int) -> list[int]:
    """0, 1, fewer than N, not a multiple of N, a multiple of N, large-ish."""
    return sorted({0, 1, max(n - 1, 1), 2 * n + 1, 3 * n, 1003})


def sweep(collective: str, n: int, dtype_ops=DTYPE_OPS) -> tuple[list[Case], set[int]]:
    """Cases for one collective: a count sweep for every algorithm, then dtypes x ops x forms.

    Returns the cases and the indices of those to run with every algorithm.
    """
    cases = []
    for count in counts_for(n):
        for in_place in (False, True):
            i = len(cases)
            cases.append(Case(collective, count, form=FORMS[i % len(FORMS)], in_place=in_place,
                              mode=MODES[i % 3]))
    cases.append(Case(collective, 20011, in_place=True))  # a few hundred KiB
    every_algorithm = set(range(len(cases)))
    counts = counts_for(n)
    for i, (dtype, op) in enumerate(dtype_ops):
        cases.append(Case(collective, counts[i % len(counts)], dtype, op,
                          form=FORMS[i % len(FORMS)], in_place=bool(i % 2), mode=MODES[i % 3]))
    return cases, every_algorithm


# ---------------------------------------------------------------- the oracle tests

def check_reductions_match_native(world):
    """Allreduce, Reduce_scatter_block, Reduce_scatter: every algorithm, dtype, op, form."""
    n = world.Get_size()
    cases, every = sweep("Allreduce", n)
    check_against_native(cases, "allreduce", every, world)
    cases, every = sweep("Reduce_scatter_block", n, DTYPE_OPS[::2])  # ops as Allreduce's
    for i in range(9):  # recvcounts given, gathered (None), and in place
        layout = "gathered" if i % 3 == 0 else "given"
        dtype, op = DTYPE_OPS[(5 * i) % len(DTYPE_OPS)]
        cases.append(Case("Reduce_scatter", i % 5, dtype, op, form=FORMS[i % len(FORMS)],
                          in_place=i % 3 == 2, mode=MODES[i % 3], layout=layout))
        every.add(len(cases) - 1)
    check_against_native(cases, "reduce_scatter", every, world)


def check_allgather_and_bcast_match_native(world):
    """Allgather, Allgatherv (every recvbuf spec form), Bcast from every root."""
    n = world.Get_size()
    kinds = ("f8", "i4", "u1", "?", "c16", "i8")
    cases = []
    for count in counts_for(n):
        for in_place in (False, True):
            i = len(cases)
            cases.append(Case("Allgather", count, kinds[i % 6], form=FORMS[i % len(FORMS)],
                              in_place=in_place, mode=MODES[i % 3]))
    layouts = ("packed", "listed", "reversed", "untyped", "equal", "strided", "inferred")
    for i, layout in enumerate(layouts * 2):
        cases.append(Case("Allgatherv", (i % 4) + (i // 7) * 5, kinds[i % 6], layout=layout,
                          form=FORMS[i % len(FORMS)], in_place=i >= 7, mode=MODES[i % 3]))
    check_against_native(cases, "allgather", set(range(len(cases))), world)
    counts = counts_for(n)
    cases = []
    for root in range(n):  # every root, two counts each
        for j in (root, root + 3):
            i = len(cases)
            cases.append(Case("Bcast", counts[j % len(counts)], kinds[i % 6],
                              form=FORMS[i % len(FORMS)], root=root, mode=MODES[i % 3]))
    cases.append(Case("Bcast", 100003, root=n - 1))
    check_against_native(cases, "bcast", set(range(len(cases))), world)


def check_many_nonblocking_collectives_in_flight(world):
    """Seven I-collectives at once on one Comm (each its own tag), completed together."""
    n, rank = world.Get_size(), world.Get_rank()
    cases = [Case("Allreduce", 1003), Case("Reduce_scatter_block", 7, "i4"),
             Case("Allgather", 5, "u1"), Case("Bcast", 9, root=n - 1),
             Case("Allgatherv", 3, "i8", layout="listed"), Case("Allreduce", 1, "i4", "MAX"),
             Case("Reduce_scatter", 3, layout="given")]
    for i, case in enumerate(cases):
        case.seed = i
    expected = [results(run_case(world, case), case) for case in cases]
    for algorithm in ("auto", "ring"):
        for waiter in ("Request.Waitall", "mpidp.waitall", "mixed", "Test"):
            comm = mpidp.Comm(world, algorithm=algorithm)
            outputs = []
            for case in cases:
                case.mode = "start"
                outputs.append(run_case(comm, case))
            requests = [case.request for case in cases]
            if waiter == "Request.Waitall":
                assert Request.Waitall(requests) is True
            elif waiter == "mpidp.waitall":
                mpidp.waitall(requests)
            elif waiter == "Test":
                while not Request.Testall(requests):
                    os.sched_yield()  # ranks share cores: a rank that spins starves its peers
            else:  # native requests in the same list: a message around the ring
                token, inbox = np.array([rank], "i"), np.full(1, -1, "i")
                ring = [world.Irecv(inbox, (rank - 1) % n, tag=7),
                        world.Isend(token, (rank + 1) % n, tag=7)]
                assert Request.Waitall(ring[:1] + requests + ring[1:]) is True
                assert inbox[0] == (rank - 1) % n
            assert all(r.Test() for r in requests) and all(r.Wait() for r in requests)
            for case, output, want in zip(cases, outputs, expected, strict=True):
                for (g, _), (e, _) in zip(results(output, case), want, strict=True):
                    assert np.array_equal(g, e), (algorithm, waiter, str(case), g, e)


# ---------------------------------------------------------------- everything else is MPI's


def check_everything_else_is_the_wrapped_communicators(world):
    n, rank = world.Get_size(), world.Get_rank()
    comm = mpidp.Comm(world, algorithm="ring")
    assert not isinstance(comm, MPI.Comm) and comm == world
    assert (comm.rank, comm.size, comm.Get_rank(), comm.Get_size()) == (rank, n, rank, n)
    assert comm.Get_name() == world.Get_name() and comm.Is_inter() is False
    # point-to-point and the pickle-based lower-case calls are mpi4py's
    inbox = np.empty(1, "i")
    comm.Sendrecv(np.array([rank], "i"), (rank + 1) % n, 3, inbox, (rank - 1) % n, 3)
    assert inbox[0] == (rank - 1) % n
    assert comm.allreduce(rank) == n * (n - 1) // 2 and comm.bcast("hi", root=0) == "hi"
    comm.Barrier()
    # new communicators come back wrapped, with the same algorithm
    dup = comm.Dup()
    half = comm.Split(rank % 2, rank)
    assert isinstance(dup, mpidp.Comm) and isinstance(half, mpidp.Comm)
    assert dup.algorithm == half.algorithm == "ring"
    native_half = world.Split(rank % 2, rank)
    x, y, z = np.arange(7.0) * rank, np.empty(7), np.empty(7)
    half.Allreduce(x, y)
    native_half.Allreduce(x, z)
    assert np.array_equal(y, z)
    dup.Allreduce(x, y)
    assert np.array_equal(y, np.arange(7.0) * (n * (n - 1) // 2))
    assert comm.Split(0 if rank == 0 else MPI.UNDEFINED) != MPI.COMM_NULL or rank != 0
    assert comm.Split(MPI.UNDEFINED) == MPI.COMM_NULL
    for c in (dup, half, native_half):
        c.Free()
    # the byte count of the ring all-reduce, through a counting comm: 2·G·(N-1)/N
    counter = mpidp.CountingComm(world)
    G = 8 * 4 * n  # bytes of gradient on each rank; N divides the count
    mpidp.Comm(counter, algorithm="ring").Allreduce(np.ones(G // 8), np.empty(G // 8))
    assert counter.bytes_sent == 2 * G * (n - 1) // n
    # no collective of the wrapped comm is ever called; collective k uses slot k of the
    # communicator's tag sequence (the tag also holds the call's signature)
    from mpidp.collectives.state import SLOTS

    spy = NoCollectives(world.Dup())  # a fresh sequence
    comm = mpidp.Comm(spy)
    x, y = np.arange(2.0 * n), np.empty(2 * n)
    comm.Allreduce(x, y)  # 0, and the cost model's calibration: 1
    with pytest.raises(ValueError):
        comm.Allreduce(x, np.empty(1))  # a failed call uses its number up: 2
    mpidp.waitall([comm.Iallreduce(x, y), comm.Ireduce_scatter_block(x, y[:2]),
                   comm.Iallgather(x[:2], y), comm.Iallgatherv(x[:2], y), comm.Ibcast(x),
                   comm.Ireduce_scatter(x, y[:2], [2] * n)])  # 3..8
    comm.Reduce_scatter(x, y[:2])  # 9; its recvcounts gathered first: 10
    slots = {(tag - mpidp.TAG_BASE) % SLOTS for tag in spy.tags}
    assert min(spy.tags, default=mpidp.TAG_BASE) >= mpidp.TAG_BASE
    assert slots == (set(range(11)) - {2} if n > 1 else set())
    spy.comm.Free()


# All of them in one launch (a launch of 8 ranks costs seconds of start-up on 2 cores).

@pytest.mark.mpi(ranks=[8], timeout=300)
def test_collectives_match_native_and_everything_else_is_the_wrapped_communicators(mpi_ranks):
    """The oracle sweeps for N = 1..8; seven I-collectives in flight at once (N = 3, 8);
    what is not a collective is the wrapped communicator's (N = 1, 4)."""
    on_each_size(SIZES, check_reductions_match_native)
    on_each_size(SIZES, check_allgather_and_bcast_match_native)
    on_each_size((3, 8), check_many_nonblocking_collectives_in_flight)
    with debug_check_off():  # the agreement check's own messages would be counted
        on_each_size((1, 4), check_everything_else_is_the_wrapped_communicators)


def test_dropin_example_agrees_with_the_mpi_library(mpiexec):
    """examples/dropin.py under mpiexec -n 4: native and mpidp results, and their agreement."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ISOLATE_MPI_IS_FORKED"}
    result = subprocess.run(
        [*mpiexec, "-n", "4", sys.executable, os.path.join(ROOT, "examples", "dropin.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "native" in out and "mpidp" in out, out
    assert "all results agree" in out and "DIFFER" not in out, out
