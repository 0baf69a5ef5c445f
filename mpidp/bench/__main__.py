"""``python -m mpidp.bench SUBCOMMAND [options]``; run it under ``mpiexec -n N``."""

import importlib
import sys

from .. import watchdog

SUBCOMMANDS = {
    "collectives": "mpidp.bench.collectives",  # nccl-tests style sweep against native MPI
    "overlap": "mpidp.bench.overlap",  # trainer: compute only / serial / overlapped steps
    "calibrate": "mpidp.bench.calibrate",  # fitted α, β, γ and predicted vs measured
    "guard": "mpidp.bench.guard",  # what the tag signature and MPIDP_DEBUG=1 cost per call
    "zero": "mpidp.bench.zero",  # memory per rank under ZeRO stages 0, 1, 2; prefetch timing
    "gpt": "mpidp.bench.gpt",  # the GPT's step serial / overlapped, its buckets, ZeRO memory
    "exact": "mpidp.bench.exact",  # EXACT_SUM against SUM (interleaved, medians)
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: python -m mpidp.bench {{{','.join(SUBCOMMANDS)}}} [options]",
              file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":  # an exception on one rank ends the job, not just that rank
    sys.exit(watchdog.run(lambda: main(sys.argv[1:]), "python -m mpidp.bench"))
