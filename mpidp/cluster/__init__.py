"""An emulated cluster on one machine: K hosts as Linux network namespaces.

Each host is a network namespace with its own loopback and one veth link to a
bridge in the root namespace; every link is shaped by traffic control (a rate
and a delay in each direction), so MPI ranks placed on different hosts talk over
real TCP through a link as slow as a cluster's network::

        root namespace:            mpidpc-br  (bridge, no address)
                                  /     |     \\
                      mpidpc-v0  mpidpc-v1  mpidpc-v2     tbf (+netem) each (bridge -> host)
                          |          |          |
     namespace mpidpc-h0: mpidp0   mpidpc-h1: mpidp0   ...  tbf (+netem) each (host -> bridge)
                        10.77.0.1            10.77.0.2

Only addresses of the subnet (default 10.77.0.0/24) are assigned, and only
inside the namespaces: the root namespace gets no address and no route, so no
traffic can leave for any other address. `mpiexec` (the mpich wheel's Hydra)
runs in host 0; it starts a proxy on every host with a launcher script that
Hydra believes is `ssh` and that does ``ip netns exec HOST ...``. The ranks
use MPICH's libfabric TCP path (``MPIR_CVAR_CH4_NETMOD=ofi``, ``FI_PROVIDER=tcp``):
with the wheel's default UCX netmod, measured, not one byte crossed the links:
UCX sees one machine and uses shared memory between the namespaces.

Every object's name starts with ``mpidpc-`` (or the prefix you pass), and only
such objects are ever deleted. `Cluster` tears everything down on exit, on an
exception and on Ctrl-C (the command line: on SIGINT, SIGTERM and SIGHUP too),
and cleans up what a killed run left before building. It holds a lock
(`mpidp.cluster.lock`) while up: a second one waits, and ``down`` refuses to
tear down a cluster a job holds unless ``--force``.

Command line::

    python -m mpidp.cluster run --hosts 4 --rate 1gbit --delay 0.1ms -- python bench.py
    python -m mpidp.cluster bench --hosts 4 --sizes 1,16   # busbw: mpidp vs native
    python -m mpidp.cluster up --hosts 2      # leave it up; prints the mpiexec line
    python -m mpidp.cluster status
    python -m mpidp.cluster down [--force]
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time

from .. import files
from .host import (  # noqa: F401 (the cluster's names: cluster.available, ...)
    PREFIX,
    ClusterError,
    _default_mpiexec,
    _live_pids,
    _sh,
    available,
    cleanup,
    names,
    netem_available,
)
from .lock import Lock

SUBNET = "10.77.0.0/24"
IFACE = "mpidp0"  # the host's link, inside its namespace
STATE_DIR = "/run/mpidp-cluster"
NETMOD_ENV = {  # MPICH's TCP path; shared memory only between ranks of one host
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": IFACE,
}

LAUNCHER = """#!/bin/sh
# Hydra's "ssh": run the proxy command inside the emulated host's namespace.
# Called as: LAUNCHER [ssh options] HOST COMMAND...   (HOST is an address)
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;   # ssh options that take a value
        -*) shift ;;
        *) break ;;
    esac
done
host="$1"; shift
case "$host" in
{cases}
    *) echo "mpidp.cluster launcher: $host is not a host of the emulated cluster" >&2; exit 255 ;;
esac
exec {ip} netns exec "$ns" /bin/sh -c "$*"
"""


class Cluster:
    """K emulated hosts joined by shaped links; a context manager.

    Args:
        hosts: how many hosts (namespaces), 1..250.
        rate: each link's rate in each direction, in tc's units ("1gbit", "100mbit").
            None: no rate limit.
        delay: one-way delay added in each direction ("0.1ms"), with netem; None: none
            (a veth adds only tens of microseconds). Some kernels lack netem
            (`netem_available()`); asking for a delay there raises ClusterError.
        subnet: the private subnet the hosts' addresses come from.
        prefix: start of every name this cluster creates (and may delete).
        burst: the token bucket's burst; at least one 64 KiB TSO segment.
    """

    def __init__(self, hosts: int = 2, rate: str | None = "1gbit", delay: str | None = None,
                 *, subnet: str = SUBNET, prefix: str = PREFIX, burst: str = "256kb"):
        net = ipaddress.ip_network(subnet)
        if not net.is_private:
            raise ValueError(f"{subnet} is not a private subnet")
        if not 1 <= hosts <= min(250, net.num_addresses - 2):
            raise ValueError(f"{hosts} hosts do not fit in {subnet}")
        if not prefix.isalnum() or len(prefix) > 8:
            raise ValueError("prefix: up to 8 letters/digits (link names have 15 characters)")
        self.n, self.rate, self.delay, self.burst = hosts, rate, delay, burst
        self.prefix, self.net = prefix, net
        self.addresses = [str(net.network_address + 1 + i) for i in range(hosts)]
        self.namespaces = [f"{prefix}-h{i}" for i in range(hosts)]
        self.state_dir = os.path.join(STATE_DIR, prefix)
        self.launcher = os.path.join(self.state_dir, "launcher.sh")
        self._lock = None
        self.is_up = False
        self.stragglers: list[str] = []
        self.timed_out = False

    # ------------------------------------------------------------ build / tear down

    def up(self, lock_timeout: float = 600.0) -> Cluster:
        """Build the hosts (after cleaning up what a killed run left)."""
        ok, why = available()
        if not ok:
            raise ClusterError(why)
        if self.delay and not netem_available():
            raise ClusterError(f"delay {self.delay} needs the netem qdisc, which this kernel "
                               "lacks (sch_netem); run without a delay")
        self._lock = Lock(self.state_dir)
        if not self._lock.take(lock_timeout):  # one cluster per prefix: a second run waits
            raise ClusterError(f"the emulated cluster ({self.prefix}) is in use by "
                               f"{self._lock.holder()}; waited {lock_timeout:.0f} s")
        try:
            cleanup(self.prefix)
            self._check_subnet_free()
            bridge = f"{self.prefix}-br"
            _sh("ip", "link", "add", bridge, "type", "bridge")
            _sh("ip", "link", "set", bridge, "up")
            for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses, strict=True)):
                veth = f"{self.prefix}-v{i}"
                _sh("ip", "netns", "add", ns)
                _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", IFACE, "netns", ns)
                _sh("ip", "link", "set", veth, "master", bridge, "up")
                _sh("ip", "-n", ns, "addr", "add", f"{addr}/{self.net.prefixlen}", "dev", IFACE)
                _sh("ip", "-n", ns, "link", "set", IFACE, "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                self._shape([], veth)  # bridge -> host
                self._shape(["-n", ns], IFACE)  # host -> bridge
            self._write_launcher()
            self.is_up = True
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Kill what runs in the hosts and delete every object with our prefix."""
        try:
            cleanup(self.prefix)
        finally:
            self.is_up = False
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _check_subnet_free(self) -> None:
        """Refuse a subnet the machine already uses: our traffic must stay ours."""
        for line in _sh("ip", "-o", "addr", "show").stdout.splitlines():
            for word in line.split():
                if "/" in word and word[0].isdigit() and "." in word:
                    iface = ipaddress.ip_interface(word)
                    if iface.network.overlaps(self.net):
                        raise ClusterError(f"{self.net} overlaps {word} already on this machine; "
                                           "pick another subnet")

    def _shape(self, where: list[str], dev: str) -> None:
        """Delay (netem) then rate (tbf) on a link's egress."""
        tc = ["tc", *where, "qdisc", "add", "dev", dev]
        parent = ["root"]
        if self.delay:
            _sh(*tc, "root", "handle", "1:", "netem", "delay", self.delay, "limit", "100000")
            parent = ["parent", "1:1"]
        if self.rate:
            _sh(*tc, *parent, "handle", "10:", "tbf", "rate", self.rate, "burst", self.burst,
                "latency", "100ms")

    def _write_launcher(self) -> None:
        cases = "\n".join(f"    {addr}) ns={ns} ;;"
                          for addr, ns in zip(self.addresses, self.namespaces, strict=True))
        text = LAUNCHER.format(cases=cases, ip=shutil.which("ip"))
        # by the one writer (a fresh temporary name, no link followed), then executable:
        # the name is only renamed into place, so no one else's file is made 0755
        files.replace(self.launcher, lambda f: f.write(text), text=True, follow=False,
                      mode=0o755)

    # ------------------------------------------------------------ faults

    def link(self, host: int, state: str) -> None:
        """Take host `host`'s link "down" or bring it back "up" (both ends)."""
        _sh("ip", "link", "set", f"{self.prefix}-v{host}", state)
        _sh("ip", "-n", self.namespaces[host], "link", "set", IFACE, state)

    def counters(self, host: int) -> dict[str, int]:
        """Bytes through host `host`'s link, seen from the bridge side."""
        path = f"/sys/class/net/{self.prefix}-v{host}/statistics/"
        return {k: int(open(path + f"{k}_bytes").read()) for k in ("rx", "tx")}

    # ------------------------------------------------------------ launching

    def mpiexec_argv(self, np_: int, argv: list[str], *, ppn: int | None = None,
                     mpiexec: str | None = None, env: dict[str, str] | None = None,
                     nolocal: bool = False, extra: list[str] | None = None) -> list[str]:
        """The command that runs `argv` as `np_` ranks, `ppn` per host (default: spread)."""
        if ppn is None:
            ppn = -(-np_ // self.n)
        if ppn * self.n < np_:
            raise ValueError(f"{np_} ranks do not fit on {self.n} hosts x {ppn} per host")
        mpiexec = mpiexec or _default_mpiexec()
        genv = {**NETMOD_ENV, **({"MPIR_CVAR_NOLOCAL": "1"} if nolocal else {}), **(env or {})}
        hosts = ",".join(f"{addr}:{ppn}" for addr in self.addresses)
        cmd = ["ip", "netns", "exec", self.namespaces[0], mpiexec,
               "-launcher", "ssh", "-launcher-exec", self.launcher,
               "-localhost", self.addresses[0], "-hosts", hosts]
        for key, value in genv.items():
            cmd += ["-genv", key, value]
        return [*cmd, *(extra or []), "-n", str(np_), *argv]

    def run(self, np_: int, argv: list[str], *, timeout: float | None = None,
            capture: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run `argv` as `np_` ranks across the hosts; kill the whole job after `timeout` s.

        A job cut short by the timeout returns code 124 (as `timeout(1)` does) and
        sets ``self.timed_out``.
        Processes still alive in the hosts after mpiexec has returned (a proxy or
        rank cut off from it) are killed and listed in ``self.stragglers``.
        """
        if not self.is_up:
            raise ClusterError("the cluster is not up: use `with Cluster(...) as c` or c.up()")
        cmd = self.mpiexec_argv(np_, argv, **kw)
        self.timed_out = False
        out = subprocess.PIPE if capture else None
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            self._stop(proc)
            stdout, stderr = proc.communicate()
            code, self.timed_out = 124, True
        except BaseException:  # Ctrl-C: stop the job, then let the caller tear down
            self._stop(proc)
            raise
        finally:
            self._kill_stragglers()
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        """SIGINT to mpiexec (it forwards to the ranks), SIGKILL to its group after 3 s."""
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(3)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def _kill_stragglers(self) -> None:
        """Proxies and ranks cut off from mpiexec (a host whose link is down) outlive it."""
        self.stragglers = []
        for _ in range(30):  # give processes that are exiting a moment
            if not any(_live_pids(ns) for ns in self.namespaces):
                return
            time.sleep(0.1)
        for ns in self.namespaces:
            for pid in _live_pids(ns):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                    os.kill(pid, signal.SIGKILL)
                    self.stragglers.append(f"{ns}: {pid} {cmdline.strip()}")
                except OSError:
                    pass
