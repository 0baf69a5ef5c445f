"""Goodbyes at a clean end, so that a rank still waiting for one that has left can name it.

A rank whose program ends with status 0 takes part in no more collectives. A
peer waiting for it in one learns nothing from MPI: its receive just never
completes, and no call says whether a peer is still there. Nor do the peers a
stuck round waits for tell: in a ring each rank waits for its left neighbour,
which waits for the rank that left. So each rank, as its program ends, sends
its exit status to every other rank, on a communicator of its own, then waits
for theirs, as ``MPI_Finalize`` would wait for them anyway (and no message is
left over for it). A rank whose deadline comes asks `Farewell.left`, which never
blocks, and `endjob.abort` adds the answer to its line::

    mpidp: rank 2 of 4: script.py failed: TimeoutError: ...; rank 1 had already left
    (its program ended with status 0); aborting the job

A program that calls ``MPI.Finalize()`` itself says goodbye from inside it
(MPI deletes ``COMM_SELF``'s attributes first thing in ``MPI_Finalize``); else
the others would wait for its goodbye while it waited for them in Finalize.

``python -m mpidp`` sets one up (``watchdog.run(..., farewell=True)``). A rank
that leaves without it (``os._exit``, or a plain ``python script.py``) says
nothing, and the line names no one.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from mpi4py import MPI


class Farewell:
    """Every rank's goodbye, on a duplicate of `comm` (collective: made by every rank
    before its program runs)."""

    TAG = 1

    def __init__(self, comm):
        self.comm = comm.Dup()  # its own: no program's message can match a goodbye
        self.statuses: dict[int, int] = {}  # rank -> the status its program ended with
        self.done = False
        self._lock = threading.Lock()  # a watchdog thread may ask while the program runs
        # A program that calls MPI.Finalize itself says goodbye there: MPI deletes the
        # attributes of COMM_SELF first thing in MPI_Finalize, with MPI still usable.
        # Otherwise the others would wait for its goodbye, and it for them in Finalize.
        keyval = MPI.Comm.Create_keyval(delete_fn=lambda *_: self.leave(0))
        MPI.COMM_SELF.Set_attr(keyval, True)

    def left(self) -> dict[int, int]:
        """The ranks whose program has ended so far, and its status (never blocks)."""
        with self._lock:
            if self.comm == MPI.COMM_NULL or MPI.Is_finalized():  # after `leave`: all heard
                return dict(self.statuses)
            while (message := self.comm.Improbe(MPI.ANY_SOURCE, self.TAG)) is not None:
                status, buf = MPI.Status(), np.empty(1, np.int64)
                message.Recv(buf, status)
                self.statuses[status.Get_source()] = int(buf[0])
            return dict(self.statuses)

    def leave(self, code: int) -> None:
        """This rank's program ended with `code`: tell every rank, wait for their goodbyes."""
        if self.done:  # at MPI_Finalize, after the program's end, or the other way round
            return
        self.done = True
        me, n = self.comm.Get_rank(), self.comm.Get_size()
        mine = np.array([code if isinstance(code, int) else 1], np.int64)
        requests = [self.comm.Isend(mine, r, self.TAG) for r in range(n) if r != me]
        heard = self.left()
        theirs = {r: np.empty(1, np.int64) for r in range(n) if r != me and r not in heard}
        requests += [self.comm.Irecv(buf, r, self.TAG) for r, buf in theirs.items()]
        pause = 1e-4  # the others may run for long yet: poll, sparing the cores they share
        while not MPI.Request.Testall(requests):
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
        self.comm.Free()
