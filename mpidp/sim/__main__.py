"""python -m mpidp.sim {table,draw,check,volume,predict,step,profile}: see docs/simulator.md."""

from __future__ import annotations

import sys
import time

from mpidp.untrusted import InputError

from .collective import names
from .engine import ScheduleError
from .flags import parse_args, size_list, where


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["step"], ["profile"]):  # their flags are the trainers' (stepcli.py)
        from .stepcli import main as step_main

        return step_main(list(argv))
    args = parse_args(argv)
    try:
        return run(args)
    except ScheduleError as e:  # a schedule of your own that MPI would not run either
        print(f"mpidp.sim {args.command}: {e}", file=sys.stderr)
        return 1


def run(args) -> int:
    if args.command == "table":
        from .table import table

        placement = where(args)
        print(table(args.algorithm, args.collective, args.ranks, args.count, args.root,
                    placement=placement and placement(args.ranks), timeout=args.timeout))
        print("→q:b sends block(s) b to rank q, ←q:b receives them from q, ↔q:b both; "
              "a step is one round of an ideal machine")
    elif args.command == "draw":
        from .. import files
        from .draw import draw

        try:
            draw(args.algorithm, args.collective, args.ranks, args.output, args.count,
                 timeout=args.timeout)
        except files.WriteError as e:  # one line naming the file
            print(f"mpidp.sim draw: error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.output}")
    elif args.command == "check":
        return run_check(args)
    elif args.command == "volume":
        from .volume import NOTE, format_volume, volume

        t0 = time.perf_counter()
        if args.exact:
            from .exact import EXACT_NOTE, exact_volume

            print(format_volume(exact_volume(args.ranks, dtype=args.exact)))
            print(f"({time.perf_counter() - t0:.1f} s)\n\n{EXACT_NOTE}")
            return 0
        print(format_volume(volume(args.ranks, args.collective, placement=where(args))))
        print(f"({time.perf_counter() - t0:.1f} s)\n\n{NOTE}")
    else:
        return run_predict(args)
    return 0


def run_check(args) -> int:
    from .conformance import check

    if args.exact:
        return run_check_exact(args)

    report = check(args.function, args.collective, args.ranks, scratch=args.scratch,
                   quick=args.quick, label=getattr(args, "function_label", args.function),
                   placement=where(args), timeout=args.timeout)
    print(report.text)
    return 0 if report.ok else 1


def run_check_exact(args) -> int:
    from .exact import check_exact

    every = names(args.collective)
    chosen = every if args.function == "all" else (args.function,)
    if args.collective not in ("allreduce", "reduce_scatter") or not set(chosen) <= set(every):
        print(f"--exact checks mpidp's allreduce and reduce_scatter algorithms ({every} or "
              "all)", file=sys.stderr)
        return 2
    failed = 0
    for name in chosen:
        t0 = time.perf_counter()
        ok, n, problem = check_exact(name, args.collective, args.ranks, quick=args.quick)
        print(f"mpidp.sim check {name} --exact ({args.collective}), N = {args.ranks[0]}-"
              f"{args.ranks[-1]}: {'ok' if ok else 'FAILED'}, {n} cases bitwise equal to one "
              f"rank's exact sum ({time.perf_counter() - t0:.1f} s)" + ("" if ok else
                                                                        f"\n  {problem}"))
        failed += not ok
    return 1 if failed else 0


def run_predict(args) -> int:
    try:
        return _predict(args)
    except InputError as e:  # a file it reads is not what it says (mpidp.untrusted)
        print(f"python -m mpidp.sim predict: error: {e}", file=sys.stderr)
        return 2


def _predict(args) -> int:
    from .predict import (
        Network,
        fit_inter,
        format_predict,
        predict,
        read_calibration,
        read_measured,
        switches,
    )

    net = read_calibration(args.calibration) if args.calibration else Network(15e-6, 0.5e-9,
                                                                                1e-9)
    given = {k: getattr(args, k) for k in ("alpha", "beta", "gamma", "fixed")
             if getattr(args, k) is not None}
    net = net._replace(**given)
    if args.fit_inter and not args.ppn:
        print("--fit-inter needs --ppn (ranks per node)", file=sys.stderr)
        return 2
    if args.ppn:
        alpha, beta = (fit_inter(args.fit_inter, net.gamma, net.fixed) if args.fit_inter
                       else (net.alpha, net.beta))
        net = net._replace(ppn=args.ppn, alpha_inter=args.alpha_inter or alpha,
                           beta_inter=args.beta_inter or beta)
    measured, ranks, sizes = None, args.ranks, args.bytes or size_list("8,64KiB,1MiB,16MiB")
    if args.compare:
        measured = read_measured(args.compare, args.collective)
        ranks = sorted({n for n, _, _ in measured})
        sizes = args.bytes or sorted({b for _, b, _ in measured})
    source = f" (from {args.calibration})" if args.calibration else ""
    level = (f"{net.ppn} ranks per node, between nodes alpha = {net.alpha_inter * 1e6:.2f} µs, "
             f"beta = {net.beta_inter * 1e9:.4f} ns/B" if net.ppn else "one level")
    print(f"# mpidp.sim predict: {args.collective}, float32; alpha = {net.alpha * 1e6:.2f} µs, "
          f"beta = {net.beta * 1e9:.4f} ns/B, gamma = {net.gamma * 1e9:.4f} ns/B, fixed = "
          f"{net.fixed * 1e6:.2f} µs{source}; {level}")
    print("# µs per call: simulated (the closed formula's in brackets)"
          + (" / measured" if measured else "") + "; best: the least simulated; auto: what "
          "`auto` picks from the formulas\n")
    t0 = time.perf_counter()
    print(format_predict(predict(args.collective, ranks, sizes, net), measured))
    print()
    for N in ranks:
        print(switches(args.collective, N, net, max(max(sizes), 1 << 30)))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
