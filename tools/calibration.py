"""Copy `make bench`'s calibrations into docs/, except a fit that found no cost.

    python -m tools.calibration bench-out/bench docs/bench

`python -m mpidp.bench calibrate` fits α, β and γ to its timings, each at least 0. On a
loaded or oversubscribed machine the fit can set β or γ to 0, and it then prints "no
cost found" beside that term. docs/simulator.md's predictions (`mpidp.sim predict
--calibration docs/bench/calibrate-n4.txt`) read these files, and a γ of 0 would make
every reduction free in them. So `make bench-publish` copies each ``calibrate-n<N>.txt``
with a fit of every term (read as `mpidp.sim predict` reads it), and keeps the one in
docs/ in place of a fit without one, saying so on stderr; a file it cannot read ends it
with one line (exit 2).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

from mpidp import files, untrusted
from mpidp.sim.predict import MAX_INPUT, parse_calibration


def publish(src: str, dest: str) -> list[str]:
    """Copy `src`'s calibrate-n*.txt into `dest` (`files.write_text`), except a fit whose β
    or γ is 0, parsed as `mpidp.sim predict` parses it; return a line for each file refused
    (untrusted.InputError for one it cannot read)."""
    refused = []
    for path in sorted(glob.glob(os.path.join(src, "calibrate-n*.txt"))):
        name = os.path.basename(path)
        text = untrusted.read_text(path, MAX_INPUT)  # read once: judged and copied alike
        fit = parse_calibration(text, path)
        if fit.beta <= 0 or fit.gamma <= 0:
            kept = os.path.exists(os.path.join(dest, name))
            refused.append(f"{path}: the fit found no cost for a term (beta {fit.beta:g}, "
                           f"gamma {fit.gamma:g} s/B: a loaded machine?), so it is not "
                           "published; "
                           + (f"{dest}/{name} is kept" if kept else f"{dest} has no {name}"))
            continue
        files.write_text(os.path.join(dest, name), text)
    return refused


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.calibration", description=__doc__)
    p.add_argument("src", help="make bench's data folder (bench-out/bench)")
    p.add_argument("dest", help="docs' data folder (docs/bench)")
    args = p.parse_args(argv)
    try:
        refused = publish(args.src, args.dest)
    except (untrusted.InputError, files.WriteError) as e:
        p.error(str(e))
    for line in refused:
        print(f"make bench-publish: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
