"""The command line of ``python -m mpidp.sim {table,draw,check,volume,predict}``: its flags,
their types, and the checks argparse cannot make alone (a usage error, exit code 2, all
the same). `step` and `profile` take the trainers' flags (`stepcli`)."""

from __future__ import annotations

import argparse

from mpidp.units import parse_size

from .collective import COLLECTIVES, names
from .conformance import load
from .engine import TIMEOUT


def rank_list(text: str) -> list[int]:
    """'4', '2,4,8', '1-64' or '2,4,8-10' -> the rank counts."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            out += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a rank count or range: {part!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"rank counts must be >= 1: {text!r}")
    return out


def at_least(low: int):
    """An argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # what argparse names in its message
    return parse


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def size_list(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",")]


def placement_list(text: str) -> tuple[int, ...]:
    """'0,0,1,1,1' -> the host of each rank."""
    try:
        hosts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of host numbers: {text!r}") from None
    if min(hosts) < 0:
        raise argparse.ArgumentTypeError(f"host numbers must be >= 0: {text!r}")
    return hosts


def where(args):
    """A function of N: the placement the flags --ppn / --hosts / --placement ask for, or None."""
    if getattr(args, "placement", None):
        return lambda N: args.placement
    ppn, hosts = getattr(args, "ppn", 0), getattr(args, "hosts", 0)
    if not ppn and not hosts:
        return None
    from mpidp.collectives.placement import layout

    return lambda N: layout(N, ppn=ppn, hosts=hosts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mpidp.sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def collective(q, default="allreduce"):
        q.add_argument("--collective", default=default, choices=COLLECTIVES)

    def timeout(q):
        q.add_argument("--timeout", type=seconds, default=TIMEOUT, help="seconds one resume of "
                       "a generator may run before it is stopped (an endless loop without "
                       f"yield; default {TIMEOUT:g})")

    def hosts(q, ppn=True):
        if ppn:
            q.add_argument("--ppn", type=at_least(0), default=0, help="ranks per host, "
                           "numbered host by host (default: one host)")
        q.add_argument("--hosts", type=at_least(0), default=0, help="hosts, the ranks spread "
                       "evenly over them, numbered host by host")
        q.add_argument("--placement", type=placement_list, help="the host of each rank, "
                       "e.g. 0,0,1,1,1 (one N only)")

    t = sub.add_parser("table", help="the step table of an algorithm, computed by running it")
    t.add_argument("algorithm", help="one of mpidp's, or MODULE:FUNCTION")
    collective(t)
    t.add_argument("--ranks", type=at_least(1), default=4)
    t.add_argument("--count", type=at_least(0), help="items of the vector (default: 4 per rank)")
    t.add_argument("--root", type=int, default=0, help="bcast: the root")
    hosts(t)
    timeout(t)

    d = sub.add_parser("draw", help="a picture of the exchange, one panel per step")
    d.add_argument("algorithm", help="one of mpidp's, or MODULE:FUNCTION")
    collective(d)
    d.add_argument("--ranks", type=at_least(1), default=4, help="at most 62")
    d.add_argument("--count", type=at_least(0), help="items of the vector (default: 4 per rank)")
    d.add_argument("-o", "--output", required=True, help="the PNG to write")
    timeout(d)

    c = sub.add_parser("check", help="check an algorithm for every N, count, op and dtype")
    c.add_argument("function", help="MODULE:FUNCTION, or the name of one of mpidp's algorithms")
    collective(c)
    c.add_argument("--ranks", type=rank_list, default=rank_list("1-64"), help="e.g. 1-64")
    c.add_argument("--scratch", help="MODULE:FUNCTION giving tmp's items from the blocks "
                   "(default: a whole vector)")
    c.add_argument("--quick", action="store_true", help="two count shapes per N, not six")
    c.add_argument("--exact", action="store_true", help="EXACT_SUM: every rank's result "
                   "bitwise the one-rank sum of the same addends (mpidp's algorithms, or all)")
    hosts(c)
    timeout(c)

    v = sub.add_parser("volume", help="bytes per rank sent and received, as multiples of G")
    v.add_argument("--ranks", type=rank_list, default=rank_list("2,4,8,16,32,64,128,256"))
    collective(v)
    v.add_argument("--exact", choices=("float64", "float32", "float16"), nargs="?",
                   const="float64", help="EXACT_SUM's all-reduce (its MAX and SUM passes), "
                   "in multiples of G of this dtype (default float64)")
    hosts(v)

    r = sub.add_parser("predict", help="each algorithm's time for N ranks, by simulation")
    collective(r)
    r.add_argument("--ranks", type=rank_list, default=rank_list("4,16,64,256,1024"))
    r.add_argument("--bytes", type=size_list, help="vector sizes, e.g. 8,64KiB,16MiB "
                   "(default: 8,64KiB,1MiB,16MiB; with --compare, the file's)")
    r.add_argument("--calibration", help="`python -m mpidp.bench calibrate` output to read "
                   "alpha, beta, gamma and fixed from (flags given too override it)")
    for name, what in (("alpha", "s per message"), ("beta", "s per byte"),
                       ("gamma", "s per reduced byte"), ("fixed", "s per call")):
        r.add_argument(f"--{name}", type=float, help=f"{what} (within a node, with --ppn)")
    r.add_argument("--ppn", type=at_least(0), default=0, help="ranks per node: two levels (the "
                   "algorithms see this placement too)")
    r.add_argument("--alpha-inter", type=float, help="s per message between nodes")
    r.add_argument("--beta-inter", type=float, help="s per byte between nodes")
    r.add_argument("--fit-inter", help="a saved `python -m mpidp.cluster bench` output (one "
                   "rank per host) to fit alpha and beta between nodes to (gamma and the "
                   "fixed cost: from the other flags)")
    r.add_argument("--compare", help="a `mpidp.bench collectives --json` file: its measured "
                   "times go beside the predictions, at its N and sizes")
    for name, what in (("step", "predict one training step of a trainer on N ranks"),
                       ("profile", "measure each unit's compute for `step --profile`")):
        sub.add_parser(name, help=f"{what} (its own flags: {name} --help)", add_help=False)
    return p


def parse_args(argv) -> argparse.Namespace:
    """The command line, checked: what argparse cannot check alone is a usage error too."""
    p = parser()
    args = p.parse_args(argv)
    ranks = [args.ranks] if isinstance(getattr(args, "ranks", None), int) else \
        getattr(args, "ranks", [])
    if args.command == "draw" and args.ranks > 62:
        p.error(f"argument --ranks: draw takes at most 62 ranks (one bit per rank), got "
                f"{args.ranks}")
    if args.command == "table" and not 0 <= args.root < args.ranks:
        p.error(f"argument --root: must be a rank of {args.ranks} (0 to {args.ranks - 1}), got "
                f"{args.root}")
    if getattr(args, "placement", None) and any(len(args.placement) != N for N in ranks):
        p.error(f"argument --placement: {len(args.placement)} hosts given, one per rank is "
                f"needed for --ranks {','.join(map(str, ranks))}")
    hosts = getattr(args, "hosts", 0)
    if hosts and hosts > min(ranks):
        p.error(f"argument --hosts: {hosts} hosts for {min(ranks)} ranks; each host needs a "
                "rank")
    for name in ("algorithm", "function", "scratch"):  # MODULE:FUNCTION: load it now
        spec = getattr(args, name, None)
        if spec is None or (name != "scratch" and spec in names(args.collective)):
            continue
        if name == "function" and spec == "all" and getattr(args, "exact", False):
            continue  # check all --exact: every algorithm of the collective
        if ":" not in spec:
            known = "" if name == "scratch" else f" or one of {', '.join(names(args.collective))}"
            p.error(f"unknown {args.collective} algorithm {spec!r}: expected MODULE:FUNCTION"
                    + known)
        try:
            setattr(args, name, load(spec, scratch=name == "scratch"))
            setattr(args, name + "_label", spec)
        except (ImportError, AttributeError) as e:
            p.error(f"cannot load {spec!r}: {e}")
        except ValueError as e:  # loaded, but not what the simulator runs
            p.error(str(e))
    return args
