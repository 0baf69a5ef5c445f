"""``python -m mpidp.bench SUBCOMMAND [options]``; run it under ``mpiexec -n N``."""

import importlib
import sys

from .. import watchdog

SUBCOMMANDS = {  # name -> (module, what it measures)
    "collectives": ("mpidp.bench.collectives",
                    "every algorithm against the MPI library, nccl-tests style"),
    "overlap": ("mpidp.bench.overlap",
                "the trainer's step: compute only, serial, overlapped (how much hides)"),
    "calibrate": ("mpidp.bench.calibrate",
                  "the fitted alpha, beta, gamma; predicted against measured"),
    "guard": ("mpidp.bench.guard", "what the tag signature and MPIDP_DEBUG=1 cost per call"),
    "zero": ("mpidp.bench.zero", "memory per rank under ZeRO stages 0-3; prefetch timing"),
    "gpt": ("mpidp.bench.gpt", "the GPT's step serial and overlapped, its buckets, its memory"),
    "exact": ("mpidp.bench.exact", "EXACT_SUM against SUM (interleaved, medians)"),
}
USAGE = "usage: python -m mpidp.bench SUBCOMMAND [options]   (under mpiexec -n N)"


def usage() -> str:
    """The usage line and one line per subcommand."""
    width = max(map(len, SUBCOMMANDS))
    lines = [USAGE, "", "subcommands (each takes --help):"]
    lines += [f"  {name:{width}}  {what}" for name, (_, what) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the subcommand `argv[0]` with the rest; 2 (and the usage) without a known one."""
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0)
    if not argv or argv[0] not in SUBCOMMANDS:
        what = "a subcommand" if not argv else f"a subcommand, not {argv[0]!r}"
        print(f"{usage()}\n\npython -m mpidp.bench: give {what} (--help: this list)",
              file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":  # an exception on one rank ends the job, not just that rank
    sys.exit(watchdog.run(lambda: main(sys.argv[1:]), "python -m mpidp.bench"))
