"""The textbook: every collective algorithm, its vocabulary, and the one registry of them.

Nothing here imports from outside this folder (NumPy aside; tests/test_algorithms_imports.py
reads the imports). Each algorithm is declared once, below, with what the rest of
mpidp needs to know of it: the entry points run it (`api`), the persistent forms
replay it (`engine.replay`), the cost model prices it (`cost`), the placement is
learned for it (`placement`), and the simulator and the benchmarks list it. Adding
an algorithm is its module and one `register` line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import NamedTuple

from . import direct, doubling, halving, hierarchical, ring, tree
from .blocks import one_block, one_vector

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast")


class Algorithm(NamedTuple):
    """One algorithm of one collective.

    Attributes:
        rounds: the generator of rounds, with the signature of its collective's
            (docs/simulator.md): all-reduce and reduce-scatter
            ``(comm, buf, blocks, op, tmp, src=None)``, all-gather ``(comm, buf, blocks)``
            (``src=None`` after them if `takes_src`),
            broadcast ``(comm, buf, root)``; ``hosts=`` after them if `placed`.
        cost: ``cost(N, G, hosts=None) -> rounds.Cost``, the rounds, bytes and reduced
            bytes of a call on G bytes and N ranks: its module docstring's cost line.
        scratch: items of ``tmp`` it needs for `blocks` (the reducing collectives).
        placed: it reads the placement: the call path learns it and hands it in (`bound`).
        replayable: it writes the buffers only by receives and through its op, so that a
            persistent collective may record its first run and replay it (`engine.replay`);
            ``"in place"``: only when `src` is None (out of place it copies the input).
        any_layout: (all-gather) it sends one block per message, so it runs in any rank's
            own layout; the others run on a packed copy where a layout is not packed.
        takes_src: (all-gather) out of place, it takes this rank's block as ``src`` and
            puts it in its place itself (after sending it from ``src``); the others get
            it copied into ``buf`` before their first round.
    """

    collective: str
    name: str
    rounds: Callable
    cost: Callable
    scratch: Callable | None = None
    placed: bool = False
    replayable: bool | str = True
    any_layout: bool = False
    takes_src: bool = False

    def bound(self, hosts):
        """The generator to run on a comm of placement `hosts`: `rounds`, the placement
        handed in if it reads it."""
        return partial(self.rounds, hosts=hosts) if self.placed else self.rounds


REGISTRY: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}


def register(algorithm: Algorithm) -> Algorithm:
    """Add `algorithm` to its collective's (after those there: the first listed wins ties)."""
    found = REGISTRY[algorithm.collective]
    if algorithm.name in found or algorithm.name == "auto":
        raise ValueError(f"{algorithm.collective} algorithm {algorithm.name!r} is registered "
                         "already" if algorithm.name in found else "'auto' is not a name")
    found[algorithm.name] = algorithm
    return algorithm


def unregister(collective: str, name: str) -> None:
    del REGISTRY[collective][name]


def entry(collective: str, name: str) -> Algorithm:
    """The registered algorithm `name` of `collective` (KeyError if there is none)."""
    return REGISTRY[collective][name]


def of(rounds) -> Algorithm | None:
    """The registered algorithm whose generator is `rounds` (bound or not), or None."""
    rounds = rounds.func if isinstance(rounds, partial) else rounds
    return next((a for table in REGISTRY.values() for a in table.values()
                 if a.rounds is rounds), None)


class Names(Mapping):
    """``mpidp.ALGORITHMS``: per collective, the names of its registered algorithms and
    ``"auto"`` (the cheapest by the cost model), read from the registry when asked."""

    def __getitem__(self, collective: str) -> tuple:
        return (*REGISTRY[collective], "auto")

    def __iter__(self):
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)

    def __repr__(self) -> str:
        return repr(dict(self))


ALGORITHMS = Names()


for _entry in (
    Algorithm("allreduce", "ring", ring.ring_allreduce, ring.ring_allreduce_cost, one_block),
    Algorithm("allreduce", "rabenseifner", halving.rabenseifner_allreduce,
              halving.rabenseifner_cost, halving.rabenseifner_scratch, placed=True),
    Algorithm("allreduce", "recursive_doubling", doubling.recursive_doubling_allreduce,
              doubling.recursive_doubling_cost, one_vector),
    Algorithm("allreduce", "naive", tree.naive_allreduce, tree.naive_cost, one_vector,
              replayable="in place"),
    Algorithm("allreduce", "direct", direct.direct_allreduce, direct.direct_cost,
              direct.direct_scratch, replayable=False),  # its own vector into the scratch
    Algorithm("allreduce", "rabenseifner_article", halving.rabenseifner_article_allreduce,
              halving.rabenseifner_article_cost, halving.rabenseifner_scratch),
    Algorithm("allreduce", "hierarchical", hierarchical.hierarchical_allreduce,
              hierarchical.hierarchical_cost, one_vector, placed=True),
    Algorithm("reduce_scatter", "ring", ring.ring_reduce_scatter, ring.ring_reduce_scatter_cost,
              one_block),
    Algorithm("reduce_scatter", "recursive_halving", halving.recursive_halving_reduce_scatter,
              halving.recursive_halving_cost, halving.halving_scratch, placed=True),
    Algorithm("allgather", "ring", ring.ring_allgather, ring.ring_allgather_cost,
              any_layout=True, takes_src=True),
    Algorithm("allgather", "recursive_doubling", halving.recursive_doubling_allgather,
              halving.recursive_doubling_allgather_cost, placed=True),
    Algorithm("bcast", "binomial", tree.binomial_bcast, tree.binomial_cost),
    Algorithm("bcast", "scatter_allgather", tree.scatter_allgather_bcast,
              tree.scatter_allgather_cost),
):
    register(_entry)
