"""mpidp.files, the one writer: links never followed for temporary files, only regular files
replaced, the old file kept on any failure, permissions kept, appends on a fresh line."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile

import pytest

from mpidp import files
from mpidp.files import WriteError


def _names(*names):
    """mkstemp's candidate names, fixed (tempfile draws them from `_get_candidate_names`):
    so that a test can plant a link at the name it will try first."""
    return lambda: iter(names)


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / ".out.json.AAAAAAAA.tmp")
    monkeypatch.setattr(tempfile, "_get_candidate_names", _names("AAAAAAAA", "BBBBBBBB"))
    files.write_json(str(tmp_path / "out.json"), {"a": 1})
    assert victim.read_text() == "precious"
    assert os.path.islink(tmp_path / ".out.json.AAAAAAAA.tmp")  # left alone, not replaced
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}
    assert not os.path.islink(tmp_path / "out.json")


def test_the_temporary_name_is_the_shape_temp_name_says(tmp_path):
    seen = []
    path = tmp_path / "ck.npz"
    files.replace(str(path), lambda f: seen.extend(os.listdir(tmp_path)))
    [tmp] = seen
    shape = files.temp_name(str(path))
    assert len(tmp) == len(shape) and tmp.startswith(".ck.npz.") and tmp.endswith(".tmp")
    assert shape == ".ck.npz.XXXXXXXX.tmp"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_target_that_is_not_a_regular_file_is_refused_and_kept(tmp_path, kind):
    path = tmp_path / "out"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(WriteError, match="not a regular file"):
        files.write_text(str(path), "x")
    mode = os.lstat(path).st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISDIR(mode)
    assert os.listdir(tmp_path) == ["out"]  # no temporary file left


def test_a_link_to_a_fifo_is_refused_too(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("fifo", tmp_path / "link")
    with pytest.raises(WriteError, match="not a regular file"):
        files.write_text(str(tmp_path / "link"), "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def test_a_symlink_the_user_named_is_followed_once_and_kept(tmp_path):
    (tmp_path / "store").mkdir()
    os.symlink("store/real.json", tmp_path / "link.json")
    files.write_json(str(tmp_path / "link.json"), [1, 2])
    assert os.path.islink(tmp_path / "link.json")
    assert json.loads((tmp_path / "store" / "real.json").read_text()) == [1, 2]


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("the writer's own bug")])
def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    path = tmp_path / "out.json"
    path.write_text("old")

    def fail(f):
        f.write("half of the new")
        raise error

    with pytest.raises(type(error) if not isinstance(error, OSError) else WriteError) as info:
        files.replace(str(path), fail, text=True)
    if isinstance(error, OSError):  # one line naming the file, the errno kept
        assert str(path) in str(info.value) and info.value.errno == errno.ENOSPC
        assert "\n" not in str(info.value)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(WriteError, match="no such folder"):
        files.write_text(str(tmp_path / "none" / "out"), "x")


def test_permissions_of_the_old_file_are_kept_and_a_new_one_follows_the_umask(tmp_path):
    old = tmp_path / "old"
    old.write_text("x")
    os.chmod(old, 0o640)
    files.write_text(str(old), "y")
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o640 and old.read_text() == "y"
    mask = os.umask(0o027)
    try:
        files.write_text(str(tmp_path / "new"), "z")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o640  # 0666 & ~0027


@pytest.mark.parametrize("before, after", [
    (None, "row\n"),                        # created
    ("", "row\n"),                          # empty
    ("a\n", "a\nrow\n"),                    # whole rows
    ('a\n{"cut', 'a\n{"cut\nrow\n'),        # a row cut off by a kill: a fresh line
])
def test_append_line_starts_on_a_fresh_line(tmp_path, before, after):
    path = tmp_path / "m.jsonl"
    if before is not None:
        path.write_text(before)
    files.append_line(str(path), "row")
    assert path.read_text() == after


def test_append_line_refuses_a_link_and_a_fifo_without_blocking(tmp_path):
    (tmp_path / "real").write_text("")
    os.symlink("real", tmp_path / "link")
    with pytest.raises(WriteError, match="symlink"):
        files.append_line(str(tmp_path / "link"), "row")
    os.mkfifo(tmp_path / "fifo")  # no reader: a blocking open would wait forever
    with pytest.raises(WriteError):
        files.append_line(str(tmp_path / "fifo"), "row")
    assert (tmp_path / "real").read_text() == ""


def test_append_line_reads_the_last_byte_through_its_descriptor(tmp_path, monkeypatch):
    """The name is swapped for a FIFO between append_line's open and its look at the last
    byte: the look is through the descriptor it opened (a reopen by name would block on
    the FIFO, no writer ever coming), and the row lands in the file it opened."""
    import threading

    path = tmp_path / "m.jsonl"
    path.write_text('{"cut": ')
    real_open = os.open

    def open_then_swap(name, flags, *a):
        fd = real_open(name, flags, *a)
        if os.fspath(name) == str(path):
            os.rename(path, tmp_path / "moved")
            os.mkfifo(path)
        return fd

    monkeypatch.setattr(files.os, "open", open_then_swap)
    done = threading.Thread(target=files.append_line, args=(str(path), "row"), daemon=True)
    done.start()
    done.join(10)
    monkeypatch.undo()
    if done.is_alive():  # unblock the reopen so the thread ends, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("append_line reopened the file by name and blocked on a FIFO")
    assert (tmp_path / "moved").read_text() == '{"cut": \nrow\n'


def test_replace_gives_the_mode_asked_for(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("old")
    os.chmod(path, 0o600)
    files.replace(str(path), lambda f: f.write("#!/bin/sh\n"), text=True, follow=False,
                  mode=0o755)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755 and path.read_text() == "#!/bin/sh\n"


def _package_sources():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpidp")
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, root), f.read()


def test_the_package_writes_files_through_the_one_writer_only():
    """Issue 33: `mpidp.files` is the only writer in the package. An `open` for writing, a
    `json.dump` to a file, a figure saved by name, a `write_text`: each would bypass its
    temporary file, its refusal of devices and links and its atomic replace. The cluster's
    lock file (opened "a+" and locked, never replaced) is the one exception."""
    import re

    writing = re.compile(r"""\bopen\([^)]*["'][rwax+bt]*[wax+][rwax+bt]*["']|json\.dump\(|"""
                         r"""(?<!files)\.write_text\(|\.write_bytes\(|savefig\((?!f,)""")
    found = [f"{path}:{n}: {line.strip()}" for path, text in _package_sources()
             if path != "files.py"
             for n, line in enumerate(text.splitlines(), 1)
             if writing.search(line) and not line.lstrip().startswith("#")
             and not (path == os.path.join("cluster", "lock.py") and '"a+"' in line)]
    assert found == [], "\n".join(found)
