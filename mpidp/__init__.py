"""mpidp: data-parallel training on MPI, with collectives written from point-to-point calls.

Two layers: `mpidp.collectives` (ring, recursive halving/doubling, trees, on a
schedule engine) and `mpidp.training` (an MLP with a hand-written backward pass
and a DataParallel wrapper that overlaps gradient all-reduce with backward).
"""

from .collectives import *  # noqa: F403
from .collectives import __all__ as _collectives_all

__version__ = "0.3.0"
__all__ = [*_collectives_all]

# The trainer (training imports collectives, never the reverse).
from .training import (  # noqa: E402
    MLP,
    SGD,
    Adam,
    AdamW,
    DataParallel,
    softmax_cross_entropy,
)

__all__ += ["Adam", "AdamW", "DataParallel", "MLP", "SGD", "softmax_cross_entropy"]
