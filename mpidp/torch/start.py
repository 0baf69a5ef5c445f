"""Start-up under mpiexec: the backend's creator, torch's store through MPI, `init_process_group`.

torch needs a key-value store shared by all ranks (rendezvous, and what some of its
helpers keep there). Under ``mpiexec`` nothing else has to be set: rank 0 binds a
`TCPStore` on a free port, and sends its addresses and the port to every rank with
MPI (`tcp_store`); each rank connects to the first address it reaches. No
MASTER_ADDR or MASTER_PORT, and it works across hosts.

The backend's creator (`create`, registered as ``"mpidp"``) gives each torch process
group an MPI communicator of its own: the world group a duplicate of
``MPI.COMM_WORLD``, a ``dist.new_group(ranks)`` the communicator of those ranks
(``MPI_Comm_create_group``: only the members call it, as only they create the group).
"""

from __future__ import annotations

import fcntl
import socket
import struct
from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI

from .group import ProcessGroup
from .options import Options, seconds


def create(backend_opts, options=None) -> ProcessGroup:
    """torch's creator of an ``"mpidp"`` process group (``extended_api=True``)."""
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"mpidp backend: pg_options must be mpidp.torch.Options, not "
                        f"{type(options).__name__}")
    world = MPI.COMM_WORLD
    ranks = list(backend_opts.global_ranks_in_group)
    if not ranks or ranks == list(range(world.Get_size())):
        comm = world.Dup()
    else:
        comm = world.Create_group(world.Get_group().Incl(ranks))
    if (comm.Get_rank(), comm.Get_size()) != (backend_opts.group_rank, backend_opts.group_size):
        raise RuntimeError(
            f"mpidp backend: torch's rank {backend_opts.group_rank} of "
            f"{backend_opts.group_size} is MPI rank {comm.Get_rank()} of {comm.Get_size()}: "
            "torch's ranks must be MPI.COMM_WORLD's (start with mpidp.torch.init_process_group())")
    return ProcessGroup(comm, seconds(backend_opts.timeout), options)


def addresses() -> list[str]:
    """This host's IPv4 addresses, loopback last (Linux: SIOCGIFADDR on each interface)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    return sorted(set(found), key=lambda a: (a.startswith("127."), a)) or ["127.0.0.1"]


def reachable(hosts: list[str], port: int, timeout_s: float = 2.0) -> str:
    """The first of `hosts` that accepts a connection on `port`."""
    for host in hosts:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return host
        except OSError:
            continue
    raise RuntimeError(f"mpidp backend: rank 0's store at port {port} is reachable at none "
                       f"of its addresses {hosts}")


def tcp_store(comm=MPI.COMM_WORLD, timeout: timedelta = timedelta(minutes=5)) -> dist.TCPStore:
    """A TCPStore served by rank 0 of `comm` on a free port, its address sent with MPI."""
    rank, size = comm.Get_rank(), comm.Get_size()
    store = None
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, size, True, timeout=timeout, wait_for_workers=False)
        where = (addresses(), store.port)
    else:
        where = None
    hosts, port = comm.bcast(where, root=0)
    if rank != 0:
        store = dist.TCPStore(reachable(hosts, port), port, size, False, timeout=timeout)
    return store


def init_process_group(algorithm="auto", *, timeout: timedelta | None = None,
                       debug: bool = False, backend: str = "mpidp",
                       progress_interval_s: float = 1e-4) -> None:
    """``dist.init_process_group`` under mpiexec: rank and size from ``MPI.COMM_WORLD``.

    Args:
        algorithm, debug, progress_interval_s: the backend's `Options`.
        timeout: the process group's timeout, mpidp's deadline for each collective
            (torch's default where None).
        backend: ``"mpidp"``, or another torch backend (``"gloo"``) started the same way.
    """
    world = MPI.COMM_WORLD
    kw = {} if timeout is None else {"timeout": timeout}
    options = Options(algorithm, debug=debug, progress_interval_s=progress_interval_s)
    dist.init_process_group(backend, store=tcp_store(world), rank=world.Get_rank(),
                            world_size=world.Get_size(),
                            pg_options=options if backend == "mpidp" else None, **kw)
