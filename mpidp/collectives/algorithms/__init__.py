"""The textbook: every collective algorithm, and the vocabulary they share.

Nothing here imports from outside this folder (NumPy aside). The tables below name
each collective's algorithms; the call path (`plans`, `exact`, `cost`) looks them up.
"""

from .direct import direct_allreduce, direct_scratch
from .halving import (
    halving_scratch,
    rabenseifner_allreduce,
    rabenseifner_article_allreduce,
    rabenseifner_scratch,
    recursive_doubling_allgather,
    recursive_doubling_allreduce,
    recursive_halving_reduce_scatter,
)
from .hierarchical import hierarchical_allreduce
from .ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from .tree import binomial_bcast, naive_allreduce, scatter_allgather_bcast

# name -> (generator, scratch items needed for a vector of `blocks`, one block per rank).
# The all-reduce and reduce-scatter generators take (comm, buf, blocks, op, tmp, src):
# out of place, `src` is sendbuf, read and never written, and `buf` receives the results.
ALLREDUCE = {
    "ring": (ring_allreduce, lambda blocks: blocks.max),
    "rabenseifner": (rabenseifner_allreduce, rabenseifner_scratch),
    "recursive_doubling": (recursive_doubling_allreduce, lambda blocks: blocks.total),
    "naive": (naive_allreduce, lambda blocks: blocks.total),
    "direct": (direct_allreduce, direct_scratch),
    "rabenseifner_article": (rabenseifner_article_allreduce, rabenseifner_scratch),
    "hierarchical": (hierarchical_allreduce, lambda blocks: blocks.total),
}
REDUCE_SCATTER = {
    "ring": (ring_reduce_scatter, lambda blocks: blocks.max),
    "recursive_halving": (recursive_halving_reduce_scatter,
                          lambda blocks: halving_scratch(blocks, len(blocks))),
}
ALLGATHER = {"ring": ring_allgather, "recursive_doubling": recursive_doubling_allgather}
# all-gathers that send one block per message, so run in any rank's own layout; the
# others send runs of neighbouring blocks and run on a packed copy where it is not
# packed (`plans.through_packed`), since MPI_Allgatherv's layouts differ across ranks
ANY_LAYOUT = {ring_allgather}
BCAST = {"binomial": binomial_bcast, "scatter_allgather": scatter_allgather_bcast}

ALGORITHMS = {
    "allreduce": (*ALLREDUCE, "auto"),
    "reduce_scatter": (*REDUCE_SCATTER, "auto"),
    "allgather": (*ALLGATHER, "auto"),
    "bcast": (*BCAST, "auto"),
}
