"""Sizes as people write them and read them: ``parse_size("64MiB")``, ``human(1 << 20)``.

Below the benchmarks and the simulator alike (both print and take sizes), so that neither
imports the other for them.
"""

from __future__ import annotations

import argparse
import re


def parse_size(text: str) -> int:
    """'8', '4K', '4KiB', '1MB', '64MiB' -> bytes (K, M, G are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8, 4KiB, 64MiB)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def human(nbytes: float) -> str:
    """Bytes in the binary units the sweep uses: 8 B, 4 KiB, 64 MiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(nbytes)} B"
