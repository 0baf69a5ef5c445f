"""The one writer: every file mpidp writes (checkpoint, trace, metrics, flight dump) goes here.

Two ways to write, both safe in a folder that others can write to (a shared
``MPIDP_FLIGHT_DIR`` under /tmp):

- `replace(path, write)`: the whole file, atomically. The data goes to a
  temporary file that `tempfile.mkstemp` creates in the target's folder
  (``O_CREAT | O_EXCL``: a random name, never an existing file, never through a
  link planted there), is flushed and fsynced, then renamed over the target, and
  the folder is fsynced. A reader sees the old file or the new one; a crash or a
  full disk leaves the old one. A target that exists must be a regular file (a
  device node, a FIFO or a folder is refused, never replaced); a target that is a
  symlink is followed once, on purpose (the user named it): the file it points to
  is replaced and the link stays.
- `append_line(path, line)`: one line at the end of a text file (metrics rows),
  opened without following a final link (``O_NOFOLLOW``), a regular file only. If
  the file's last line was cut off (a killed run), the new line starts on a
  fresh line instead of being glued onto it.

Every problem is a `WriteError` (an ``OSError``) whose message is one line naming
the path. This module imports nothing from mpidp, so every layer may use it.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from typing import IO


class WriteError(OSError):
    """A file cannot be written where it was asked for (one line, naming the path)."""


def target(path: str, follow: bool = True) -> str:
    """Where `replace` writes for `path`: the file a symlink points to (`follow`), else
    `path`; WriteError if that exists and is not a regular file (nor, unfollowed, a link)."""
    path_ = os.path.expanduser(path)
    real = os.path.realpath(path_) if follow else os.path.abspath(path_)
    try:
        mode = (os.stat if follow else os.lstat)(real).st_mode
    except FileNotFoundError:
        return real
    except OSError as e:
        raise WriteError(f"{path}: cannot be written ({e.strerror})") from None
    if not (stat.S_ISREG(mode) or (not follow and stat.S_ISLNK(mode))):
        raise WriteError(f"{path}: exists and is not a regular file (a device, FIFO, socket "
                         "or folder): refused, it would be replaced by a regular file")
    return real


def temp_name(path: str) -> str:
    """The shape of the temporary file's name `replace` writes beside `path`'s target
    (``.NAME.XXXXXXXX.tmp``, the X's random): a trainer checks at start that it fits."""
    return f"{_TEMP_PREFIX.format(os.path.basename(target(path)))}{'X' * 8}{_TEMP_SUFFIX}"


_TEMP_PREFIX, _TEMP_SUFFIX = ".{}.", ".tmp"  # mkstemp puts 8 random characters between


def replace(path: str, write: Callable[[IO], None], text: bool = False,
            follow: bool = True, mode: int | None = None) -> None:
    """Write `path` atomically: `write(f)` fills a fresh temporary file beside the target,
    which is then renamed over it (WriteError on any failure; the old file stays).
    `follow=False`: a symlink at `path` is replaced, not followed. `mode`: the new file's
    permissions (None: the old file's, or 0666 less the umask for a new one)."""
    real = target(path, follow)
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise WriteError(f"{path}: no such folder {folder}")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=_TEMP_SUFFIX,
                                   prefix=_TEMP_PREFIX.format(os.path.basename(real)))
    except OSError as e:
        raise _error(f"{path}: cannot create a file in {folder} ({e.strerror})", e) from None
    try:
        with os.fdopen(fd, "w" if text else "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        if mode is not None:
            os.chmod(tmp, mode)
        elif os.path.exists(real) and (follow or not os.path.islink(real)):
            # keep the old file's permissions, not mkstemp's 0600
            os.chmod(tmp, stat.S_IMODE(os.stat(real).st_mode))
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, real)
    except OSError as e:
        _remove(tmp)
        raise _error(f"{path}: not written ({e.strerror or e})", e) from None
    except BaseException:
        _remove(tmp)
        raise
    _fsync_folder(folder)


def write_json(path: str, data, follow: bool = True, **dump_args) -> None:
    """`replace` with `data` as JSON text."""
    replace(path, lambda f: json.dump(data, f, **dump_args), text=True, follow=follow)


def write_text(path: str, content: str) -> None:
    """`replace` with `content` as text."""
    replace(path, lambda f: f.write(content), text=True)


def append_line(path: str, line: str) -> None:
    """Append `line` (a newline is added) to the text file `path`, created if missing;
    after a cut-off last line, on a fresh line. WriteError for a link or non-regular file."""
    # read and write: the last byte is read through this descriptor, not the name again
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(os.path.expanduser(path), flags, 0o666)
    except OSError as e:
        raise WriteError(f"{path}: cannot append to it ({e.strerror}"
                         f"{'; a symlink' if os.path.islink(path) else ''})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise WriteError(f"{path}: not a regular file: refused")
        text = line.rstrip("\n") + "\n"
        if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
            text = "\n" + text  # the last row was cut off: start a fresh line
        os.write(fd, text.encode())
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(f"{path}: not written ({e.strerror})") from None
    finally:
        os.close(fd)


def _error(message: str, cause: OSError) -> WriteError:
    """A WriteError saying `message`, with the errno of the OSError that caused it."""
    error = WriteError(message)
    error.errno = cause.errno  # callers may tell ENOSPC or ENAMETOOLONG apart
    return error


def _remove(tmp: str) -> None:
    try:
        os.remove(tmp)
    except OSError:
        pass


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every
    thread for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for row in f:
                if row.startswith("Umask:"):
                    return int(row.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)  # make the rename itself durable
    except OSError:
        pass
    finally:
        os.close(fd)
