"""The emulated cluster's lock: one cluster per prefix at a time, and who holds it.

`Cluster.up` takes it, and holds it until `Cluster.down` (``run`` and ``bench``:
for the whole job); a second ``run`` waits for it, and ``python -m mpidp.cluster
down`` refuses to tear down under a holder unless forced, naming the holder.
It is an ``flock`` on ``/run/mpidp-cluster/PREFIX/lock``: the kernel frees it
when the holder dies, so a killed run never leaves it locked. The file holds
the holder's pid and command line, for the message.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
import time


class Lock:
    """The lock file in `folder` (created if need be)."""

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, "lock")
        self._file = None

    def try_take(self) -> bool:
        """Take it if it is free; then write who we are into it."""
        f = open(self.path, "a+")  # "w" would wipe the holder's name before we know it is free
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} ({shlex.join([sys.executable, *sys.argv])})\n")
        f.flush()
        self._file = f
        return True

    def take(self, timeout: float) -> bool:
        """Wait up to `timeout` s for it; False if it stayed taken."""
        deadline = time.monotonic() + timeout
        while not self.try_take():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def holder(self) -> str:
        """Who holds it (or held it last): "pid N (command line)"."""
        try:
            with open(self.path) as f:
                return f.read().strip() or "an unknown process"
        except OSError:
            return "an unknown process"

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file drops the flock
            self._file = None

    @property
    def held(self) -> bool:
        return self._file is not None
