"""mpidp.sim: run any mpidp schedule for N ranks in one process, with no MPI.

Every mpidp algorithm is a generator of rounds of `Send`/`Recv` descriptions; the
simulator runs the unchanged generators of N ranks together, matches every send
with its receive, checks the schedule and counts what it moves. See
docs/simulator.md; ``python -m mpidp.sim {table,draw,check,volume,predict}``.
"""

from .collective import COLLECTIVES, Outcome, make_input, names, reference, simulate
from .engine import ScheduleError, Sim, SimComm

__all__ = ["COLLECTIVES", "Outcome", "ScheduleError", "Sim", "SimComm", "make_input", "names",
           "reference", "simulate"]
