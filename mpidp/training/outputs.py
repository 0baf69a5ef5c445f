"""A trainer's output files, checked at start: a problem is found before any training, not after.

A trainer writes up to three files from rank 0, each through `mpidp.files`:
metrics (JSON lines, one per evaluation, appended as it goes), a trace (at the
end) and a checkpoint (both replaced whole: a temporary file beside the target,
then renamed over it). `check` finds each way one of them could not be written,
or would destroy another:

- no such folder, a folder where the file should be, a folder or a file that
  cannot be written, an existing path that is not a regular file (a device, a
  FIFO: it would be replaced, or block the run);
- a name longer than the file system allows, or a checkpoint or trace name that
  leaves no room for the temporary file written beside it (``.NAME.XXXXXXXX.tmp``);
- two flags naming one file, after resolving symlinks, or as two hard links:
  each write would replace the other's (a trace where the checkpoint was, the
  metrics rows gone with the next checkpoint);
- an existing checkpoint that neither ``--resume`` nor ``--overwrite`` lets the
  run replace.

It is the writer's check (rank 0's); a trainer hands the problem to
`mpidp.cli.agree`, so that every rank exits with code 2 together, before any work::

    problem = outputs.check({"--metrics": args.metrics, "--trace": args.trace,
                             "--checkpoint": args.checkpoint}, checkpoint="--checkpoint",
                            replace=args.resume or args.overwrite) if rank == 0 else None
    cli.agree(comm, problem, PROG)
"""

from __future__ import annotations

import json
import os

from .. import files

NAME_MAX = 255  # the usual limit of a name (not a path) where pathconf cannot say


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def _problem(flag: str, path: str, replaced: bool) -> str | None:
    """What stops `path` from being written (whole, by `files.replace`, if `replaced`;
    else appended to), or None."""
    where = f"{flag} {path}"
    target = os.path.realpath(path)  # through a symlink, its target is what is written
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        return f"{where}: there is no folder {folder}"
    if os.path.isdir(target):
        return f"{where} is a folder"
    longest, name = _name_max(folder), os.path.basename(target)
    if len(name) > longest:
        return f"{where}: a name of {len(name)} characters; the file system allows {longest}"
    try:
        files.target(path)  # a device or a FIFO is refused, never replaced nor opened
    except files.WriteError as e:
        return f"{flag} {e}"
    if replaced:
        tmp = files.temp_name(path)
        if len(tmp) > longest:
            return (f"{where}: a name of {len(name)} characters leaves no room for the "
                    f"temporary file written beside it ({tmp}, {len(tmp)} characters; the "
                    f"file system allows {longest}): use a shorter name, of at most "
                    f"{longest - (len(tmp) - len(name))} characters")
    # a replaced file is written beside its target, then renamed: it needs the folder
    writable = target if os.path.exists(target) and not replaced else folder
    if not os.access(writable, os.W_OK):
        return f"{where}: {writable} is not writable"
    return None


def _same(a: str, b: str) -> str | None:
    """How `a` and `b` are one file (its name, or both of a hard link's), or None."""
    real_a, real_b = os.path.realpath(a), os.path.realpath(b)
    if real_a == real_b:
        return real_a
    try:
        return f"hard links: {real_a}, {real_b}" if os.path.samefile(a, b) else None
    except OSError:  # one of them is not there yet: two names, two files
        return None


def check(paths: dict[str, str | None], checkpoint: str | None = None,
          replace: bool = False, appended: tuple = ("--metrics",)) -> str | None:
    """The first problem that would stop rank 0 from writing `paths`, or None.

    Args:
        paths: flag -> the path it names (None: not given), e.g. ``{"--metrics": ...}``.
        checkpoint: the flag among them that `checkpoint.save` writes.
        appended: the flags whose files are appended to (metrics); the others are
            replaced whole.
        replace: an existing checkpoint may be replaced (``--resume`` or ``--overwrite``).
    """
    given = [(flag, path) for flag, path in paths.items() if path is not None]
    for flag, path in given:
        problem = _problem(flag, path, flag not in appended)
        if problem:
            return problem
    for i, (flag_a, a) in enumerate(given):
        for flag_b, b in given[i + 1:]:
            one = _same(a, b)
            if one:
                return (f"{flag_a} {a} and {flag_b} {b} name the same file ({one}): each "
                        "write would replace the other's; give each its own file")
    path = paths.get(checkpoint) if checkpoint else None
    if path is not None and os.path.exists(path) and not replace:
        return (f"{checkpoint} {path} exists: pass --resume to continue from it, "
                "or --overwrite to replace it")
    return None


class Metrics:
    """Rank 0's metrics file: ``write(row)`` appends one JSON object as a line.

    Every row goes through `files.append_line`: after a row cut off by a killed run,
    the next one starts on a fresh line. The file is emptied at start unless the run
    resumes; a symlink the user named is followed once (its target is written), as
    `files.replace` does. Other ranks, or no `path`: rows are dropped.
    """

    def __init__(self, path: str | None, rank: int, resume: bool):
        self.path = files.target(path) if path is not None and rank == 0 else None
        if self.path is not None and not resume:
            files.write_text(self.path, "")

    def write(self, row: dict) -> None:
        if self.path is not None:
            files.append_line(self.path, json.dumps(row))
