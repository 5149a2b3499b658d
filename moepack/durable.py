"""Durability helpers shared by the converter and the downloader."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory by path (a directory: makes renames and new entries in it
    durable). Raises OSError (FileNotFoundError, ...) like os.open; the descriptor is always
    closed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with naming(path):
            os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """An OSError raised inside that names no file (os.write, os.pwrite, os.fsync, ftruncate on
    a descriptor: a full disk, RLIMIT_FSIZE, a filesystem gone read-only) is raised again naming
    `path`, same errno and class, so the one error line says where: `[Errno 28] No space left on
    device: 'OUT.moepack.journal'` rather than the bare errno text."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(path)) from e
