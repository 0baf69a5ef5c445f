"""mpidp.sim: run any mpidp schedule for N ranks in one process, with no MPI.

Every mpidp algorithm is a generator of rounds of `Send`/`Recv` descriptions; the
simulator runs the unchanged generators of N ranks together, matches every send
with its receive, checks the schedule and counts what it moves. See
docs/simulator.md; ``python -m mpidp.sim {table,draw,check,volume,predict}``; from Python,
``mpidp.sim.check(fn, "allreduce", range(1, 65))`` is the conformance kit (`conformance`).
"""

from .collective import COLLECTIVES, Outcome, make_input, names, reference, simulate
from .conformance import Report, check
from .engine import ScheduleError, Sim, SimComm

__all__ = ["COLLECTIVES", "Outcome", "Report", "ScheduleError", "Sim", "SimComm", "check",
           "make_input", "names", "reference", "simulate"]
