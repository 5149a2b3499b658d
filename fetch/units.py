"""Byte counts for people: formatting and parsing sizes such as 16MiB."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def human(n: float) -> str:
    """Binary units, 3 significant digits: 1.50 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """'16MiB', '16M', '16777216' -> bytes. Raises ValueError naming the text."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]i?)?[bB]?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4MiB, 16M, 1048576)")
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
