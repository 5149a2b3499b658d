"""Durability helpers shared by the converter and the downloader."""

from __future__ import annotations

import errno
import fcntl
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


def reserve(fd: int, size: int, *, blocks: bool = False) -> None:
    """Make the file `size` bytes long, its blocks allocated where the filesystem can
    (posix_fallocate: a full disk or RLIMIT_FSIZE fails now, not hours into the work). Where it
    cannot, `blocks=True` writes the zeros instead (a file written through a mapping must own its
    blocks: a hole filled through one on a full disk is a SIGBUS, not an error); otherwise the
    file is extended with holes."""
    start = os.fstat(fd).st_size
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
            return
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    if not blocks:
        os.ftruncate(fd, size)
        return
    zeros = bytes(1 << 20)
    while start < size:
        start += os.pwrite(fd, zeros[: min(len(zeros), size - start)], start)


def flock_holder(fd: int) -> int | None:
    """The id of a process holding a `flock` on the file open at `fd` (from Linux's
    /proc/locks), for a refusal to name; None when it cannot be told (another system, a lock
    taken through another mount namespace)."""
    st = os.fstat(fd)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want:
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def try_flock(fd: int) -> str | None:
    """Take an exclusive, non-blocking `flock` on `fd`: None when taken, else words naming who
    holds it ("process 1234" where /proc/locks says, else "another process")."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = flock_holder(fd)
        return f"process {pid}" if pid is not None else "another process"
    return None
