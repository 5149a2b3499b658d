"""One fetch per destination: two processes appending to the same partial file would corrupt it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moepack.fetch.errors import FetchError

from moepack.durable import try_flock


@contextmanager
def dest_lock(dest: Path) -> Iterator[None]:
    """Exclusive, non-blocking flock on the directory itself: no lock file is left behind, and
    the kernel releases it when the process dies, even by SIGKILL."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise FetchError(f"cannot use {dest} as destination: {e.strerror or e}") from e
    try:
        holder = try_flock(fd)
        if holder is not None:
            raise FetchError(f"{dest}: another moepack fetch is writing here ({holder} holds "
                             "its lock); wait for it to finish or choose another --dest")
        yield
    finally:
        os.close(fd)
