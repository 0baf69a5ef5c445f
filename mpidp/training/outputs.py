"""A trainer's output files, checked at start: a problem is found before any training, not after.

A trainer writes up to three files from rank 0: metrics (JSON lines, one per
epoch, as it goes), a trace (at the end) and a checkpoint (a temporary file
beside its target, then renamed over it: see checkpoint.py). `check` finds each
way one of them could not be written, or would destroy another:

- no such folder, a folder where the file should be, a folder or a file that
  cannot be written;
- a name longer than the file system allows, or a checkpoint name that leaves no
  room for the temporary file written beside it (``.NAME.tmpPID``);
- two flags naming one file, after resolving symlinks, or as two hard links:
  each write would replace the other's (a trace where the checkpoint was, the
  metrics rows gone with the next checkpoint);
- an existing checkpoint that neither ``--resume`` nor ``--overwrite`` lets the
  run replace.

It is the writer's check (rank 0's: its pid is in the temporary file's name); a
trainer hands the problem to `mpidp.cli.agree`, so that every rank exits with
code 2 together, before any work::

    problem = outputs.check({"--metrics": args.metrics, "--trace": args.trace,
                             "--checkpoint": args.checkpoint}, checkpoint="--checkpoint",
                            replace=args.resume or args.overwrite) if rank == 0 else None
    cli.agree(comm, problem, PROG)
"""

from __future__ import annotations

import os

from . import checkpoint as _checkpoint

NAME_MAX = 255  # the usual limit of a name (not a path) where pathconf cannot say


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def _problem(flag: str, path: str, is_checkpoint: bool) -> str | None:
    """What stops `path` from being written, or None."""
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
    if is_checkpoint:
        tmp = os.path.basename(_checkpoint.temp_path(path))
        if len(tmp) > longest:
            return (f"{where}: a name of {len(name)} characters leaves no room for the "
                    f"temporary file written beside it (.NAME.tmp{os.getpid()}, "
                    f"{len(tmp)} characters; the file system allows {longest}): use a "
                    f"shorter name, of at most {longest - (len(tmp) - len(name))} characters")
    # a checkpoint is written beside its target, then renamed: it needs the folder
    writable = target if os.path.exists(target) and not is_checkpoint else folder
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


def check(files: dict[str, str | None], checkpoint: str | None = None,
          replace: bool = False) -> str | None:
    """The first problem that would stop rank 0 from writing `files`, or None.

    Args:
        files: flag -> the path it names (None: not given), e.g. ``{"--metrics": ...}``.
        checkpoint: the flag among them that `checkpoint.save` writes.
        replace: an existing checkpoint may be replaced (``--resume`` or ``--overwrite``).
    """
    given = [(flag, path) for flag, path in files.items() if path is not None]
    for flag, path in given:
        problem = _problem(flag, path, flag == checkpoint)
        if problem:
            return problem
    for i, (flag_a, a) in enumerate(given):
        for flag_b, b in given[i + 1:]:
            one = _same(a, b)
            if one:
                return (f"{flag_a} {a} and {flag_b} {b} name the same file ({one}): each "
                        "write would replace the other's; give each its own file")
    path = files.get(checkpoint) if checkpoint else None
    if path is not None and os.path.exists(path) and not replace:
        return (f"{checkpoint} {path} exists: pass --resume to continue from it, "
                "or --overwrite to replace it")
    return None
