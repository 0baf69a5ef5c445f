"""Copy `make bench`'s calibrations into docs/, except a fit that found no cost.

    python -m tools.calibration bench-out/bench docs/bench

`python -m mpidp.bench calibrate` fits α, β and γ to its timings, each at least 0. On a
loaded or oversubscribed machine the fit can set β or γ to 0, and it then prints "no
cost found" beside that term. docs/simulator.md's predictions (`mpidp.sim predict
--calibration docs/bench/calibrate-n4.txt`) read these files, and a γ of 0 would make
every reduction free in them. So `make bench-publish` copies each ``calibrate-n<N>.txt``
with a fit of every term, and keeps the one in docs/ in place of a fit without one,
saying so on stderr.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys

NO_COST = "no cost found"  # what `bench.calibrate.rate` prints for a term fitted to 0


def publish(src: str, dest: str) -> list[str]:
    """Copy `src`'s calibrate-n*.txt into `dest`, except a fit that found no cost; return
    a line for each file that was not copied."""
    refused = []
    for path in sorted(glob.glob(os.path.join(src, "calibrate-n*.txt"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            fit = f.read()
        if NO_COST in fit:
            kept = os.path.exists(os.path.join(dest, name))
            refused.append(f"{path}: the fit found no cost for a term ({NO_COST!r}: a "
                           f"loaded machine?), so it is not published; "
                           + (f"{dest}/{name} is kept" if kept else f"{dest} has no {name}"))
            continue
        shutil.copyfile(path, os.path.join(dest, name))
    return refused


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.calibration", description=__doc__)
    p.add_argument("src", help="make bench's data folder (bench-out/bench)")
    p.add_argument("dest", help="docs' data folder (docs/bench)")
    args = p.parse_args(argv)
    for line in publish(args.src, args.dest):
        print(f"make bench-publish: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
