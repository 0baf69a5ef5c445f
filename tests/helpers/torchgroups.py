"""torch process groups of each size, mpidp's and gloo's side by side, in one launch.

    start()                       the world group (the mpidp backend), once per job
    for k, mp, gl in pairs(range(1, 5)):   # on the ranks 0..k-1 of each size
        ...                       run the same call on mp (mpidp) and gl (gloo), compare

`pairs` makes both groups of each size on every rank (``dist.new_group`` is called by
all ranks), and yields only on the members. After each size the ranks agree whether it
failed anywhere (as `subcomms.on_each_size`), so one rank's failure ends every rank's
test instead of leaving the others waiting in the next size's collectives.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI

from helpers.subcomms import raise_where_any_failed


def start(timeout_s: float = 120) -> None:
    """The world process group on the mpidp backend (once per launched job)."""
    import torch

    import mpidp.torch

    torch.set_num_threads(1)  # 4 ranks on the suite's 2 cores: one compute thread each
    if not dist.is_initialized():
        mpidp.torch.init_process_group(timeout=timedelta(seconds=timeout_s))


def on_each_size(sizes: Iterable[int], check, **options) -> None:
    """``check(k, mp, gl)`` on the ranks 0..k-1 of each size k: `mp` an mpidp group of
    those ranks, `gl` a gloo group of the same ranks. `options`: `mpidp.torch.Options`."""
    import mpidp.torch

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    for k in sizes:
        ranks = list(range(k))
        mp = dist.new_group(ranks, backend="mpidp", pg_options=mpidp.torch.Options(**options))
        gl = dist.new_group(ranks, backend="gloo")
        error = None
        if rank < k:
            try:
                check(k, mp, gl)
            except BaseException as e:  # noqa: B036 (raised again below, after the others know)
                error = e
        raise_where_any_failed(world, error, k)
