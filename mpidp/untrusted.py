"""The one reader: every untrusted file or value is checked here before it is used.

Flight records, checkpoints' settings, resume flags and ``MPIDP_*`` values come
from outside the program: a file can be truncated, hand-edited, from another job,
a FIFO, or made to hurt (``"size": 10**12``, a list nested 10,000 deep). So
nothing read is allocated from, indexed with or looped over before its type and
bounds are checked, and every refusal is one `InputError` line naming the file
(or variable) and the field::

    flight-rank-1.json: comms[0].calls[3].count: 10**15 is out of range (0 to 2**40)

Two parts:

- `read_json(path, max_bytes)`: the file's JSON, opened without blocking (a FIFO
  is refused, not waited on) and without following a final link, a regular file
  of at most `max_bytes`, nesting at most `MAX_DEPTH` deep; `read_text` the same
  for a text file, `parse_json` for JSON text read from elsewhere.
- the schema: `Int`, `Num`, `Text`, `Bool`, `List`, `Record`, `Either`, `Null`,
  and `check(value, schema, where)`, which returns the value checked (ints as
  Python ints) or raises InputError naming the first field that is wrong. A
  `Record` lists its fields; unknown fields are kept but never read.

This module imports nothing from mpidp, so every layer may use it.
"""

from __future__ import annotations

import json
import math
import operator
import os
import stat
from dataclasses import dataclass, field

MAX_DEPTH = 64  # JSON nesting: records are a few levels deep; json's recursion is ~1000


class InputError(ValueError):
    """Untrusted input that is refused (one line: where, which field, what is wrong)."""


def read_text(path: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file `path` (InputError for a missing, non-regular,
    oversize or undecodable file)."""
    try:
        return _read(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({_one_line(e)})") from None


def _read(path: str, max_bytes: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file (a FIFO, device or folder)")
        if info.st_size > max_bytes:
            raise InputError(f"{path}: {info.st_size} bytes, more than the {max_bytes} "
                             "such a file may hold")
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise InputError(f"{path}: more than the {max_bytes} bytes such a file may hold")
    return raw


def read_json(path: str, max_bytes: int):
    """The JSON value in the regular file `path` (InputError for a missing, non-regular,
    oversize, undecodable or too deeply nested file)."""
    raw = _read(path, max_bytes)
    if _depth(raw) > MAX_DEPTH:
        raise InputError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InputError(f"{path}: not valid JSON ({_one_line(e)})") from None


def parse_json(text: str, where: str):
    """The JSON value of `text` (a string read from elsewhere, such as a checkpoint's entry):
    InputError, naming `where`, if it is not JSON or nested more than `MAX_DEPTH` deep."""
    raw = text.encode("utf-8", errors="surrogatepass")
    if _depth(raw) > MAX_DEPTH:
        raise InputError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{where}: not valid JSON ({_one_line(e)})") from None


def _no_constant(name: str):
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def _depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside strings (cheap, before json.loads recurses)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


# ------------------------------------------------------------------ the schema


@dataclass(frozen=True)
class Int:
    """A whole number in [lo, hi] (bool refused: True is not a count)."""
    lo: int = -(1 << 63)
    hi: int = (1 << 63) - 1

    def check(self, v, where):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"{where}: {_show(v)} is not a whole number")
        if not self.lo <= v <= self.hi:
            raise InputError(f"{where}: {_show(v)} is out of range ({self.lo} to {self.hi})")
        return int(v)


@dataclass(frozen=True)
class Num:
    """A number (int or float) in [lo, hi]; `finite`: nan and inf refused."""
    lo: float = -math.inf
    hi: float = math.inf
    finite: bool = True

    def check(self, v, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputError(f"{where}: {_show(v)} is not a number")
        if self.finite and not math.isfinite(v):
            raise InputError(f"{where}: {_show(v)} is not a finite number")
        if not (math.isnan(v) or self.lo <= v <= self.hi):
            raise InputError(f"{where}: {_show(v)} is out of range ({self.lo} to {self.hi})")
        return v


@dataclass(frozen=True)
class Text:
    """A string of at most `max_len` characters; `choices`: one of them."""
    max_len: int = 4096
    choices: tuple | None = None

    def check(self, v, where):
        if not isinstance(v, str):
            raise InputError(f"{where}: {_show(v)} is not a string")
        if len(v) > self.max_len:
            raise InputError(f"{where}: a string of {len(v)} characters (at most "
                             f"{self.max_len})")
        if self.choices is not None and v not in self.choices:
            raise InputError(f"{where}: {_show(v)} is not one of "
                             f"{', '.join(map(repr, self.choices))}")
        return v


@dataclass(frozen=True)
class Bool:
    def check(self, v, where):
        if not isinstance(v, bool):
            raise InputError(f"{where}: {_show(v)} is not true or false")
        return v


@dataclass(frozen=True)
class Null:
    def check(self, v, where):
        if v is not None:
            raise InputError(f"{where}: {_show(v)} is not null")
        return v


@dataclass(frozen=True)
class Any:
    """Anything (kept as read: only shown, never indexed or allocated from)."""
    def check(self, v, where):
        return v


@dataclass(frozen=True)
class List:
    """A list of at most `max_len` items, each `of`."""
    of: object
    max_len: int = 1 << 16
    min_len: int = 0

    def check(self, v, where):
        if not isinstance(v, list):
            raise InputError(f"{where}: {_show(v)} is not a list")
        if not self.min_len <= len(v) <= self.max_len:
            raise InputError(f"{where}: a list of {len(v)} items (from {self.min_len} to "
                             f"{self.max_len})")
        return [check(x, self.of, f"{where}[{i}]") for i, x in enumerate(v)]


@dataclass(frozen=True)
class Either:
    """The first of `options` that `v` passes (the error: the last option's)."""
    options: tuple

    def check(self, v, where):
        error = None
        for option in self.options:
            try:
                return check(v, option, where)
            except InputError as e:
                error = e
        raise error if error else InputError(f"{where}: no option")


def Optional(schema) -> Either:  # noqa: N802 - reads as a type
    """`schema` or null."""
    return Either((Null(), schema))


@dataclass(frozen=True)
class Record:
    """A JSON object with these `fields` (name -> schema); `optional`: names that may be
    missing. Other keys are kept unchecked but never read."""
    fields: dict = field(default_factory=dict)
    optional: frozenset = frozenset()

    def check(self, v, where):
        if not isinstance(v, dict):
            raise InputError(f"{where}: {_show(v)} is not an object")
        out = dict(v)
        for name, schema in self.fields.items():
            if name not in v:
                if name in self.optional:
                    continue
                raise InputError(f"{where}: no field {name!r}")
            out[name] = check(v[name], schema, f"{where}.{name}" if where else name)
        return out


def check(value, schema, where: str = ""):
    """`value` if it meets `schema` (ints as Python ints), else InputError naming the field."""
    return schema.check(value, where or "value")


def index(v, what: str) -> int:
    """`v` as a whole number by ``operator.index`` (2.9, "3" and True refused: TypeError
    naming `what`); for integer arguments of the API, not for files."""
    if isinstance(v, bool):
        raise TypeError(f"{what} must be a whole number, not {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be a whole number, not {type(v).__name__} "
                        f"{_show(v)}") from None


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
