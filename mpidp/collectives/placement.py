"""Placement: which host each rank runs on, and how it is learned.

A placement is a tuple with one host number per rank, hosts numbered 0, 1, ... in
the order of their first rank: ``(0, 0, 1, 1)`` is 2 hosts × 2 ranks numbered host
by host (algorithms/hosts.py). It is learned once per communicator and kept in its
`state.CommState`:

- an mpi4py communicator: ``Split_type(COMM_TYPE_SHARED)`` groups the ranks that
  share memory (a host), and an allgather of each group's leader (its lowest world
  rank) numbers them. Both are MPI collectives on the communicator (queries, not
  data), so `placement` runs them where every rank arrives in the same order: the
  planning of the first collective whose algorithm reads it (`locate`: the
  registry's ``placed``), or `auto`'s, as `cost.calibrate` runs there, after the
  agreement check of MPIDP_DEBUG;
- a comm-like object says it with a ``placement`` attribute (`CountingComm`'s
  argument); None there means one host.

The query has the deadline of every blocking call, ``MPIDP_TIMEOUT`` (`_deadline`),
and shows in the flight record while it runs.

`known` reads it without communicating, and the call path hands it to the
algorithms that read it (they never look it up: they must never start a
collective of their own). What it costs across hosts is each algorithm's
``cost`` (the registry), priced by cost.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

from .. import flight
from .algorithms import entry
from .engine.completion import timeout_from_env
from .state import state

EXIT_TIMEOUT = 124  # watchdog.EXIT_TIMEOUT (the call path does not import the watchdog)


def normalize(hosts) -> tuple[int, ...]:
    """Host labels (any hashable per rank) as 0, 1, ... in the order of first appearance."""
    seen: dict = {}
    return tuple(seen.setdefault(h, len(seen)) for h in hosts)


def layout(N: int, ppn: int | None = None, hosts: int | None = None) -> tuple[int, ...]:
    """The placement of N ranks numbered host by host: `ppn` per host (the last one may
    have fewer), or spread over `hosts` hosts as evenly as can be (larger hosts first)."""
    if ppn:
        return tuple(r // ppn for r in range(N))
    if hosts:
        return tuple(r * hosts // N for r in range(N))
    return (0,) * N


def known(comm) -> tuple[int, ...] | None:
    """The comm's placement if it is known (None: not learned, or one host); no messages."""
    try:
        return comm.placement  # a comm-like that carries its own (None: one host)
    except AttributeError:
        return state(comm).placement


def placement(comm) -> tuple[int, ...]:
    """The comm's placement, learned now if it is not known (collective on an MPI comm)."""
    found = known(comm)
    if found is not None or hasattr(comm, "placement"):
        return found if found is not None else (0,) * comm.Get_size()
    from mpi4py import MPI

    base = comm
    while not isinstance(base, MPI.Comm) and hasattr(base, "comm"):
        base = base.comm
    if not isinstance(base, MPI.Comm):  # a comm-like that wraps none and says nothing
        found = (0,) * comm.Get_size()
    else:
        with _deadline(state(comm).flight):
            host = base.Split_type(MPI.COMM_TYPE_SHARED)
            try:
                leader = host.allreduce(MPI.COMM_WORLD.Get_rank(), op=MPI.MIN)
            finally:
                host.Free()
            found = normalize(base.allgather(leader))
    state(comm).placement = found
    return found


# The query, as the flight recorder shows it: a collective of MPI's, not of mpidp's
QUERY = SimpleNamespace(collective="placement query (Split_type)", description={})


@contextmanager
def _deadline(recorder):
    """The query's deadline: MPI's Split_type, allreduce and allgather block, and nothing
    interrupts them, so at ``MPIDP_TIMEOUT`` a timer ends the job as `endjob.abort`
    does (one line, this rank's flight record, MPI_Abort; exit code 124). The query is an
    entry of the communicator's flight record meanwhile (no number in its sequence)."""
    entry = None
    if recorder is not None:
        entry = recorder.add(None)
        entry[flight.SIGNED], entry[flight.STATE] = QUERY, flight.STARTED
    timeout = timeout_from_env()
    timer = None if timeout is None else threading.Timer(timeout, _expired, (timeout,))
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
    if entry is not None:
        entry[flight.STATE] = flight.COMPLETE


def _expired(timeout: float) -> None:
    from mpi4py import MPI

    flight.ending = True
    try:
        where = f" (flight record: {flight.dump('placement query deadline')})" \
            if flight.keep() else ""
    except Exception:  # noqa: BLE001 - the job must end all the same
        where = ""
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    sys.stderr.write(f"mpidp: rank {rank} of {size}: the placement query (Split_type) of the "
                     f"first call that reads it made no progress for {timeout:g} s "
                     "(MPIDP_TIMEOUT): a peer is dead, hangs or never made that call; "
                     f"aborting the job{where}\n")
    sys.stderr.flush()
    time.sleep(0.5)  # the line reaches mpiexec before the abort tears the job down
    MPI.COMM_WORLD.Abort(EXIT_TIMEOUT)
    os._exit(EXIT_TIMEOUT)


def locate(comm, comm_state, collective: str, algorithm: str) -> tuple[int, ...] | None:
    """The placement to hand to `algorithm` (None: it reads none, or one host), learned now
    if it reads it and it is not known yet (once per communicator: a query, collective like
    auto's calibration, planned after the call's tag and MPIDP_DEBUG's agreement check)."""
    if not entry(collective, algorithm).placed:
        return None
    if comm_state.placement is None:
        placement(comm)
    return known(comm)
