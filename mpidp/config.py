"""The ``MPIDP_*`` environment variables: each one's values, read and checked in one place.

``VARIABLES`` names them all, each with the function that turns its text into a
value (MPIDP_DEBUG: 1/true/yes/on or 0/false/no/off; MPIDP_TIMEOUT: seconds > 0;
MPIDP_COST: "default" or 3 to 5 numbers; MPIDP_STAGING, MPIDP_CUDA_AWARE: 1 or 0;
MPIDP_FLIGHT: a whole number from 0 to `FLIGHT_MAX`; MPIDP_FLIGHT_DIR: a folder, ``~``
expanded).
Unset and empty mean the same; surrounding spaces are ignored. The one table of
their values and defaults is in docs/failures.md ("Environment variables").

Any other value is a `ConfigError` (a ``ValueError``) naming the variable, the
value and the values it takes, raised where the variable is used: never at
import, so that a bad value cannot make ``import mpidp`` fail with a traceback.
`check` reads them all at once: ``python -m mpidp`` and the trainer call it
first, and turn a bad value into one line and exit code 2. `debug_enabled` keeps
MPIDP_DEBUG's value once read (the agreement check asks at every collective;
`set_debug` overrides it for this process).

This module imports nothing from mpidp, so every layer may use it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """An ``MPIDP_*`` variable holds a value it does not take."""


def _error(name: str, value: str, expected: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: expected {expected}")


def _flag(name: str, value: str) -> bool:
    word = value.strip().lower()
    if word in ON:
        return True
    if word in OFF or not word:
        return False
    raise _error(name, value, f"{', '.join(ON)} (on) or {', '.join(OFF)} or empty (off)")


def _seconds(name: str, value) -> float:
    """`value` as seconds: a finite number > 0, else ConfigError naming `name`."""
    try:
        s = float(value)
    except (TypeError, ValueError):
        s = math.nan
    if not (math.isfinite(s) and s > 0):  # nan spins, inf overflows, <= 0 fires at once
        raise _error(name, value, "a finite number of seconds > 0")
    return s


def _timeout(name: str, value: str) -> float | None:
    return _seconds(name, value) if value.strip() else None


def _cost(name: str, value: str) -> str | tuple[float, ...] | None:
    text = value.strip()
    if not text:
        return None
    if text == "default":
        return "default"
    expected = ("'default' or alpha,beta,gamma[,fixed[,beta_inter]]: 3 to 5 comma-separated "
                "finite numbers >= 0 (seconds, seconds per byte)")
    try:
        numbers = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise _error(name, value, expected) from None
    if not 3 <= len(numbers) <= 5 or not all(math.isfinite(x) and x >= 0 for x in numbers):
        raise _error(name, value, expected)
    return numbers


# MPIDP_FLIGHT's bound: a deque's length must fit a C ssize_t, and a record of more calls
# per communicator than this (each dumped entry ~0.5 kB) is more than anyone reads
FLIGHT_MAX = 1 << 16


def _count(name: str, value: str) -> int | None:
    text = value.strip()
    if not text:
        return None
    try:
        k = int(text)
    except ValueError:
        k = -1
    if not 0 <= k <= FLIGHT_MAX:
        raise _error(name, value, f"a whole number >= 0 (0: off), at most {FLIGHT_MAX}")
    return k


def _folder(name: str, value: str) -> str | None:
    """A folder, with a leading ``~`` expanded as a shell would (the variable is often set
    in quotes, where the shell does not)."""
    text = value.strip()
    return os.path.expanduser(text) if text else None


def _choice(values: dict[str, object]) -> Callable[[str, str], object]:
    def parse(name: str, value: str):
        try:
            return values[value.strip()]
        except KeyError:
            named = ", ".join(repr(v) for v in values if v)
            raise _error(name, value, f"{named}, or unset") from None
    return parse


# name -> how its text becomes a value (the empty text: the variable is unset)
VARIABLES: dict[str, Callable[[str, str], object]] = {
    "MPIDP_DEBUG": _flag,
    "MPIDP_TIMEOUT": _timeout,
    "MPIDP_COST": _cost,
    "MPIDP_STAGING": _choice({"1": "all", "0": "off", "": "auto"}),
    "MPIDP_CUDA_AWARE": _choice({"1": True, "0": False, "": None}),
    "MPIDP_FLIGHT": _count,  # collectives kept per communicator (mpidp.flight); None: 64
    "MPIDP_FLIGHT_DIR": _folder,  # where each rank's record is dumped; None: ./mpidp-flight
}


def get(name: str):
    """The value of the variable `name` now (os.environ is read at each call); ConfigError
    if it holds a value it does not take."""
    return parse(name, os.environ.get(name, ""))


def parse(name: str, text: str):
    """What `text` means as the value of `name` (the empty text: unset)."""
    return VARIABLES[name](name, text)


# MPIDP_DEBUG, read at the first collective, not at import (a bad value is an error, and
# `import mpidp` must not fail on it); then kept: os.environ costs ~1 µs a call
_DEBUG: bool | None = None


def debug_enabled(asked: bool = False) -> bool:
    """Run the agreement check (`collectives.checks.agree`)? ``MPIDP_DEBUG=1`` turns it
    on whatever the call says.

    ConfigError (a ValueError naming the variable) if MPIDP_DEBUG holds another value.
    """
    global _DEBUG
    if asked:
        return True
    if _DEBUG is None:
        _DEBUG = get("MPIDP_DEBUG")
    return _DEBUG


def set_debug(on: bool | None) -> None:
    """Turn the environment's check on or off for this process (tests that count bytes);
    None: as MPIDP_DEBUG says (read again at the next collective)."""
    global _DEBUG
    _DEBUG = None if on is None else bool(on)


def problems() -> list[str]:
    """What is wrong with the environment: one message per bad variable, [] if none."""
    found = []
    for name in VARIABLES:
        try:
            get(name)
        except ConfigError as e:
            found.append(str(e))
    return found


def check() -> None:
    """Raise one ConfigError naming every bad ``MPIDP_*`` variable, if there is any."""
    found = problems()
    if found:
        raise ConfigError("; ".join(found))
