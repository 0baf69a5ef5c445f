"""``python -m mpidp.cluster``: build an emulated cluster, run or benchmark on it, tear down.

The subcommands (``run``, ``bench``, ``up``, ``down``, ``status``) are listed in
the docstring of `mpidp.cluster`; ``bench-rank`` is what ``bench`` starts on
every rank.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import shlex
import signal
import sys

from . import PREFIX, STATE_DIR, SUBNET, Cluster, ClusterError, available, cleanup, names
from . import __doc__ as cluster_doc
from .bench import bench_rank
from .lock import Lock


def _rate_bps(rate: str | None) -> float | None:
    """tc's "1gbit" / "100mbit" / "500kbit" in bytes per second."""
    if not rate:
        return None
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise ValueError(f"rate {rate!r}: use gbit, mbit or kbit")


# ---------------------------------------------------------------- command line
# Every flag is checked as it is parsed (argparse's error: exit 2), so that nothing is
# built, as root, for a command that was never going to run.

MAX_HOSTS = 250  # one /24: addresses .1 to .250, as `Cluster` assigns them


def _count(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)  # a ValueError here: argparse says "invalid _count value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


_count.__name__ = "int"


def _hosts(text: str) -> int:
    value = _count(text)
    if value > MAX_HOSTS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_HOSTS}, got {text}")
    return value


_hosts.__name__ = "int"


def _seconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


_seconds.__name__ = "float"


def _subnet(text: str) -> str:
    """An argparse type: a private network address with its prefix, such as 10.77.0.0/24."""
    try:
        net = ipaddress.ip_network(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a subnet (a network address and a prefix length, such as "
            f"{SUBNET})") from None
    if not net.is_private:
        raise argparse.ArgumentTypeError(f"{text} is not a private subnet; our traffic must "
                                         "stay off addresses others may use")
    return text


def _rate(text: str) -> str:
    """An argparse type: "none", or a rate in tc units that `_rate_bps` reads too."""
    if text != "none":
        try:
            _rate_bps(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number with gbit, mbit, "
                                             "kbit or bit (such as 1gbit), or none") from None
    return text


def _delay(text: str) -> str:
    """An argparse type: "none", or a time in tc units (s, ms, us)."""
    if text != "none" and not re.fullmatch(r"\d+(\.\d*)?(s|ms|us)", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a time such as 0.1ms, 50us "
                                         "or 1s, or none")
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mpidp.cluster",
                                description=cluster_doc.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def shape(q):
        q.add_argument("--hosts", type=_hosts, default=2,
                       help=f"emulated hosts, 1 to {MAX_HOSTS} (default 2)")
        q.add_argument("--rate", type=_rate, default="1gbit",
                       help="link rate, tc units; 'none' for no limit")
        q.add_argument("--delay", type=_delay, default="none",
                       help="one-way delay, e.g. 0.1ms (needs netem); default none")
        q.add_argument("--subnet", type=_subnet, default=SUBNET)

    run = sub.add_parser("run", help="build, run a command across the hosts, tear down")
    shape(run)
    run.add_argument("-n", "--np", type=_count, help="ranks (default: one per host)")
    run.add_argument("--ppn", type=_count, help="ranks per host")
    run.add_argument("--nolocal", action="store_true",
                     help="no shared memory even between ranks of one host (MPIR_CVAR_NOLOCAL=1)")
    run.add_argument("--timeout", type=_seconds, help="kill the job after this many seconds")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- command ...")
    bench = sub.add_parser("bench", help="all-reduce busbw across the hosts, mpidp vs native")
    shape(bench)
    bench.add_argument("--ppn", type=_count, default=1, help="ranks per host")
    bench.add_argument("--sizes", default="0.25,1,4,16", help="MiB, comma-separated")
    bench.add_argument("--iters", type=_count, default=3)
    bench.add_argument("--algorithms", default="", help="all-reduce algorithms, "
                       "comma-separated (default: all of mpidp's)")
    rank = sub.add_parser("bench-rank", help=argparse.SUPPRESS)
    rank.add_argument("sizes")
    rank.add_argument("iters", type=int)
    rank.add_argument("rate")
    rank.add_argument("algorithms", nargs="?", default="")
    up = sub.add_parser("up", help="build and leave up (one cluster at a time)")
    shape(up)
    down = sub.add_parser("down", help="tear down everything mpidp.cluster made")
    down.add_argument("--force", action="store_true",
                      help="even while a job holds the cluster (that job is killed)")
    sub.add_parser("status", help="list our namespaces and links")
    p.commands = {"run": run, "bench": bench, "up": up}  # for errors found after parsing
    return p


class Interrupted(BaseException):
    """A signal arrived: unwind through `with cluster`, which tears everything down."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, a closed terminal


def _terminate(signum, frame) -> None:
    for s in SIGNALS:  # a second signal must not cut the teardown short
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


def _down(force: bool) -> int:
    """Tear down, unless a job holds the cluster's lock (then only with `force`)."""
    lock = Lock(os.path.join(STATE_DIR, PREFIX))
    if not lock.try_take():
        if not force:
            print(f"mpidp.cluster: the emulated cluster is in use by {lock.holder()}; "
                  "let that job finish or stop it, or `down --force` to end it",
                  file=sys.stderr)
            return 2
        print(f"mpidp.cluster: --force: tearing down under {lock.holder()}", file=sys.stderr)
    try:
        gone = cleanup()
    finally:
        lock.release()
    print("removed: " + (" ".join(gone) or "nothing"))
    return 0


def main(args: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(args)
    if a.cmd in ("run", "bench", "up"):
        room = ipaddress.ip_network(a.subnet).num_addresses - 2  # less network and broadcast
        if a.hosts > room:
            p.commands[a.cmd].error(
                f"{a.hosts} hosts do not fit in {a.subnet} ({room} addresses)")
        if a.cmd == "run" and a.np and a.ppn and a.np > a.hosts * a.ppn:
            p.commands[a.cmd].error(f"{a.np} ranks do not fit on {a.hosts} hosts x "
                                    f"{a.ppn} per host")
    if a.cmd == "bench-rank":  # an MPI rank: an exception on one ends the job
        from .. import watchdog

        return watchdog.run(lambda: bench_rank([float(v) for v in a.sizes.split(",")], a.iters,
                                               _rate_bps(None if a.rate == "none" else a.rate),
                                               [x for x in a.algorithms.split(",") if x]),
                            "mpidp.cluster bench-rank")
    for s in SIGNALS:
        signal.signal(s, _terminate)
    try:
        return _command(a)
    except Interrupted as e:
        print(f"mpidp.cluster: interrupted ({signal.Signals(e.signum).name}); torn down",
              file=sys.stderr)
        return 128 + e.signum


def own_python(argv: list[str]) -> list[str]:
    """`argv` with a bare ``python`` (or ``python3``) as this interpreter, ``sys.executable``.

    The ranks start from a fresh shell inside the hosts, where ``python`` is the first on
    PATH (the system's, without mpidp and mpi4py unless the venv is activated); the one
    running ``python -m mpidp.cluster`` has them. A path (``/usr/bin/python3``) is as given.
    """
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return argv


def _command(a: argparse.Namespace) -> int:
    if a.cmd in ("down", "status"):
        ok, why = available()
        if not ok:
            print(f"mpidp.cluster: {why}", file=sys.stderr)
            return 2
        if a.cmd == "down":
            return _down(a.force)
        ns, links = names()
        print("namespaces:", " ".join(ns) or "none")
        print("links:", " ".join(links) or "none")
        return 0
    rate = None if a.rate == "none" else a.rate
    delay = None if a.delay == "none" else a.delay
    cluster = Cluster(a.hosts, rate, delay, subnet=a.subnet)
    try:
        if a.cmd == "up":
            cluster.up()
            cluster._lock.release()  # leave it up for others to use by hand
            argv = cluster.mpiexec_argv(a.hosts, [sys.executable, "script.py"])
            print(f"{a.hosts} hosts up: {' '.join(cluster.addresses)} "
                  f"({rate or 'no rate limit'}, {delay or 'no delay'})")
            print("run:  " + shlex.join(argv))
            print("down: python -m mpidp.cluster down")
            return 0
        if a.cmd == "bench":
            with cluster:
                return cluster.run(a.hosts * a.ppn, [
                    sys.executable, "-m", "mpidp.cluster", "bench-rank", a.sizes,
                    str(a.iters), a.rate, a.algorithms], ppn=a.ppn).returncode
        argv = own_python(a.argv[1:] if a.argv[:1] == ["--"] else a.argv)
        if not argv:
            print("mpidp.cluster run: give a command after --", file=sys.stderr)
            return 2
        with cluster:
            result = cluster.run(a.np or a.hosts * (a.ppn or 1), argv, ppn=a.ppn,
                                 nolocal=a.nolocal, timeout=a.timeout)
        if cluster.timed_out:
            print(f"mpidp.cluster: job killed after {a.timeout} s", file=sys.stderr)
        return result.returncode
    except ClusterError as e:
        print(f"mpidp.cluster: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
