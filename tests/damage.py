"""Damage a file in place, for tests of integrity checks."""

from __future__ import annotations

from pathlib import Path


def flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    """XOR the byte at `offset` with `mask`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))
