"""What this machine offers an emulated cluster, and what old clusters left behind.

`available` (root, Linux, iproute2, namespaces and tc qdiscs that work), `netem_available`
(an added delay), `names` (our namespaces and links, by `PREFIX`), `cleanup` (kill what
runs in them, delete them), `_default_mpiexec` (the venv's, else the PATH's); `_sh`
runs one command and raises `ClusterError` on failure.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "mpidpc"  # distinctive: nothing else on the machine is called this


class ClusterError(RuntimeError):
    """The emulated cluster cannot be built here (not root, no iproute2, no netns)."""


def _sh(*argv: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode:
        raise ClusterError(f"{shlex.join(argv)} failed: {result.stderr.strip() or result.stdout}")
    return result


def available() -> tuple[bool, str]:
    """Can an emulated cluster be built here? Returns (ok, why not)."""
    if sys.platform != "linux":
        return False, "the emulated cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return False, "the emulated cluster needs root (network namespaces, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"the emulated cluster needs iproute2 (`{tool}` not found)"
    probe = f"mpidpprobe{os.getpid()}"  # not ours-prefixed: cleanup() never races it
    try:
        _sh("ip", "netns", "add", probe)
        try:
            _sh("ip", "-n", probe, "link", "set", "lo", "up")
            _sh("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root",
                "tbf", "rate", "1gbit", "burst", "256kb", "latency", "50ms")
        finally:
            _sh("ip", "netns", "del", probe, check=False)
    except ClusterError as e:
        return False, f"network namespaces or tc qdiscs do not work here: {e}"
    return True, ""


def netem_available() -> bool:
    """Is the netem qdisc (needed for an added delay) in this kernel?"""
    probe = f"mpidpprobe{os.getpid()}"  # not ours-prefixed: cleanup() never races it
    _sh("ip", "netns", "add", probe)
    try:
        return not _sh("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root",
                       "netem", "delay", "0.1ms", check=False).returncode
    finally:
        _sh("ip", "netns", "del", probe, check=False)


def names(prefix: str = PREFIX) -> tuple[list[str], list[str]]:
    """The namespaces and root-namespace links that carry our prefix."""
    ns = [line.split()[0] for line in _sh("ip", "netns", "list").stdout.splitlines()
          if line.startswith(prefix + "-")]
    links = []
    for line in _sh("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(prefix + "-"):
            links.append(name)
    return ns, links


def cleanup(prefix: str = PREFIX) -> list[str]:
    """Kill the processes in our namespaces, delete our namespaces and links; return them."""
    if not prefix or "-" in prefix:
        raise ValueError(f"refusing to clean up with prefix {prefix!r}")
    ns, links = names(prefix)
    for name in ns:  # a process keeps a namespace alive after `ip netns del`
        for pid in _live_pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for link in links:  # deleting one end of a veth deletes the other
        _sh("ip", "link", "del", link, check=False)
    for name in ns:
        _sh("ip", "netns", "del", name, check=False)
    for _ in range(50):  # namespaces are dismantled asynchronously
        if names(prefix) == ([], []):
            break
        time.sleep(0.1)
    return ns + links


def _live_pids(ns: str) -> list[int]:
    """Processes in namespace `ns`, less zombies (dead already; an init that does not
    reap them, as in some containers, leaves them listed)."""
    pids = []
    for pid in _sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in "ZX":
            pids.append(int(pid))
    return pids


def _default_mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise ClusterError("no mpiexec found (install the mpich wheel: pip install mpich)")
    return os.path.abspath(found)
