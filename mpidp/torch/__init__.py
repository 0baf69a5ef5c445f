"""mpidp as a torch.distributed backend: ``import mpidp.torch`` registers ``"mpidp"``.

Under ``mpiexec``::

    import mpidp.torch
    mpidp.torch.init_process_group()          # rank, size from MPI.COMM_WORLD; no MASTER_ADDR
    model = DistributedDataParallel(model)    # its gradients reduced by mpidp's collectives

or ``dist.init_process_group("mpidp", store=..., rank=..., world_size=...)`` after the
import; settings (the algorithm, the agreement check) through ``pg_options=Options(...)``.
The backend (`group.ProcessGroup`) runs mpidp's nonblocking collectives on NumPy views
of the tensors; its Work objects are mpidp requests, completed by a progress thread.
See docs/torch.md for what is supported and how it differs from gloo.
"""

import os

import torch
import torch.distributed as dist

from .. import flight
from .exact import ExactGradients, exact_avg_hook
from .group import ProcessGroup
from .options import Options
from .start import init_process_group, tcp_store
from .work import Work

__all__ = ["ExactGradients", "Options", "ProcessGroup", "Work", "exact_avg_hook",
           "init_process_group", "tcp_store"]

# a flight record's call site is the user's line, not torch's: dist.all_reduce's caller,
# or for DDP's bucket reductions (started inside autograd) the line of loss.backward()
flight.skip_frames_under(os.path.dirname(torch.__file__))

if "MPIDP" not in dist.Backend._plugins:  # a second import (importlib.reload) registers nothing
    from .start import create

    dist.Backend.register_backend("mpidp", create, extended_api=True, devices=["cpu"])
