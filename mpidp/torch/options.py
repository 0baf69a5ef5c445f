"""The backend's settings (`Options`), and torch's timeouts as seconds."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from ..collectives import api
from ..collectives.checks import check_algorithms as check_algorithm


class Options:
    """The backend's settings: ``dist.init_process_group("mpidp", pg_options=Options(...))``
    or ``dist.new_group(..., pg_options=...)``, or `mpidp.torch.init_process_group`'s keywords.

    Args:
        algorithm: as for `mpidp.Comm`: a name used by every collective that has it
            (``"ring"``), or ``{collective: name}``; ``"auto"``: mpidp's cost model chooses.
        debug: check at every collective that all ranks passed the same arguments
            (``MPIDP_DEBUG=1`` turns it on everywhere, as for every mpidp collective).
        progress_interval_s: the progress thread's sleep between passes that moved nothing.
    """

    def __init__(self, algorithm="auto", *, debug: bool = False,
                 progress_interval_s: float = 1e-4):
        check_algorithm(algorithm)  # mpidp.Comm's check: a name, or {collective: name}
        self.algorithm = dict(algorithm) if isinstance(algorithm, Mapping) else algorithm
        self.debug, self.progress_interval_s = debug, progress_interval_s

    def for_collective(self, collective: str) -> str:
        if isinstance(self.algorithm, dict):
            return self.algorithm.get(collective, "auto")
        return self.algorithm if self.algorithm in api.ALGORITHMS.get(collective, ()) else "auto"


def seconds(timeout: timedelta | None) -> float | None:
    """A torch timeout as seconds (None: none)."""
    if timeout is None:
        return None
    s = timeout.total_seconds()
    return s if s > 0 else None

