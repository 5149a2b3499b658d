"""Durability helper shared by the converter and the downloader."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory by path (a directory: makes renames and new entries in it
    durable). Raises OSError (FileNotFoundError, ...) like os.open; the descriptor is always
    closed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
