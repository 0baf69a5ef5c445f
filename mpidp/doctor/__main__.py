"""``python -m mpidp.doctor DIR [--json] [--plot FILE.png] [--replay]``: why the job whose
flight records are in DIR hung, in plain words (the cause in one line, then the evidence);
``--replay`` runs the recorded collectives again in mpidp.sim and says whether the same
ranks stall in the same rounds (`mpidp.doctor.replay`).

Exit code 0 with a diagnosis; 2, with one line naming the file and field, when DIR holds
no readable record, a record is malformed or of another kind, or --plot names a file that
cannot be written (checked first, before any work).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections import defaultdict

from ..untrusted import InputError
from . import Unreadable, diagnose, ranks_text, read, short


def text(d: dict, folder: str) -> str:
    """The diagnosis as the doctor prints it."""
    c = d["cause"]
    out = [f"note: {w}" for w in d.get("warnings", [])]
    out += [f"cause: {c['text']}", "",
           f"evidence ({len(d['records'])} of {d['size']} ranks left a record in {folder}; "
           f"job {', '.join(d['jobs'])}):"]
    if d["missing"]:
        out.append(f"  no record: {ranks_text(d['missing'])} (killed, or died before writing)")
    first = d["first_difference"]
    if first:
        out.append(f"  first difference: collective #{first['seq']} on {first['comm']}")
        for g in first["groups"]:
            out.append(f"    {ranks_text(g['ranks'])}: {g['call']} at "
                       f"{', '.join(map(short, g['sites']))} ({', '.join(g['states'])})")
        if first["behind"]:
            out.append(f"    {ranks_text(first['behind'])}: never reached it")
    mine, waits = defaultdict(list), defaultdict(list)  # grouped once: not per rank
    for f in d["in_flight"]:
        mine[f["rank"]].append(f)
    for e in d["edges"]:
        waits[e["from"], e["seq"], e["comm"]].append(e)
    for r in sorted(d["where"]):
        w = d["where"][r]
        if mine[r]:
            for f in mine[r]:
                pend = ", ".join(f"{e['kind']} {'from' if e['kind'] == 'recv' else 'to'} "
                                 f"{e['to']}" for e in waits[r, f["seq"], f["comm"]])
                rnd = f" round {f['round']}" if f.get("round") is not None else ""
                out.append(f"  rank {r}: in {f.get('collective', '?')} #{f['seq']} on "
                           f"{f['comm']}{rnd} ({f['state']}, called at {short(f['site'])})"
                           + (f", waiting: {pend}" if pend else ""))
        else:
            out.append(f"  rank {r}: {w['text']}")
    if d["edges"]:
        out.append("  waits-for: " + "; ".join(f"{e['from']} -> {e['to']} ({e['label']})"
                                            for e in d["edges"]))
    out.append("  cycles: " + ("; ".join(" -> ".join(map(str, c + c[:1])) for c in d["cycles"])
                               or "none"))
    out.append("  roots (waited for, waiting for nobody): "
               + (", ".join(map(str, d["roots"])) or "none"))
    for r, reason in sorted(d["raised"].items()):
        out.append(f"  rank {r} raised: {reason}")
    out += [f"  note: {n}" for n in d["notes"]]
    return "\n".join(out)


PLOT_FORMATS = ("png", "svg", "pdf")  # what --plot writes, by the file name's ending


def plot_problem(path: str) -> str | None:
    """Why `--plot path` cannot be written (None: it can), checked before any work."""
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in PLOT_FORMATS:
        return (f"--plot {path}: the name must end in "
                f"{', '.join('.' + f for f in PLOT_FORMATS)} (the picture's format)")
    parent = os.path.dirname(os.path.abspath(os.path.expanduser(path)))
    if not os.path.isdir(parent):
        return f"--plot {path}: no such folder {parent}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--plot {path}: the folder {parent} cannot be written"
    return None


def main(argv: list[str] | None = None) -> int:
    about = " ".join(__doc__.split("\n\n")[0].split())  # the first paragraph, whole
    p = argparse.ArgumentParser(prog="python -m mpidp.doctor", description=about)
    p.add_argument("folder", help="the folder of the flight records (MPIDP_FLIGHT_DIR)")
    p.add_argument("--json", action="store_true", help="the diagnosis as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw the waits-for graph to FILE (.png, "
                   ".svg or .pdf)")
    p.add_argument("--replay", action="store_true",
                   help="run every rank's recorded collectives in mpidp.sim (one process, no "
                        "MPI) and compare where they stall with the records")
    args = p.parse_args(argv)
    if argv is None:  # as a command: `| head` ends it quietly, as it does other tools
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    problem = args.plot and plot_problem(args.plot)
    if problem:
        print(f"mpidp.doctor: error: {problem}", file=sys.stderr)
        return 2
    try:
        records, warnings = read(args.folder)
        d = diagnose(records, warnings)
        if args.replay:
            from . import replay

            d["replay"] = replay.replay(records)
    except (Unreadable, InputError) as e:  # one line naming the file and field
        print(f"mpidp.doctor: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        print(text(d, args.folder))
        if args.replay:
            print("\n" + "\n".join(replay.text(d["replay"])))
    if args.plot:
        from .plot import draw

        draw(d, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
