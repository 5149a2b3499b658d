"""The disk's physical limit, measured in the same run as whatever is compared with it.

O_DIRECT reads bypass the page cache, so these are device numbers, not RAM numbers (a peer's
disk benchmark measured the page cache on Linux). Queue depth = concurrent reader threads;
`os.preadv` releases the GIL, so Python threads keep that many requests in flight.
"""

from __future__ import annotations

import mmap
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PROBE_ALIGN = 4096


@dataclass(frozen=True)
class Bandwidth:
    bytes_read: int
    seconds: float
    o_direct: bool

    @property
    def gb_per_s(self) -> float:
        return self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else 0.0


def _open(path: Path) -> tuple[int, bool]:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except (AttributeError, OSError):
        return os.open(path, os.O_RDONLY), False


def make_probe_file(path: Path, size: int, chunk: int = 64 << 20) -> None:
    """Write `size` bytes of incompressible data and drop them from the page cache."""
    rng = random.Random(0)
    block = rng.randbytes(chunk)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(chunk, left)])
            left -= chunk
        f.flush()
        os.fsync(f.fileno())
    drop_cache(path)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def sequential_read(path: Path, block: int = 8 << 20, limit: int | None = None) -> Bandwidth:
    """One thread, large aligned reads from the start of the file."""
    fd, direct = _open(path)
    buf = mmap.mmap(-1, block)
    size = os.fstat(fd).st_size if limit is None else min(limit, os.fstat(fd).st_size)
    size -= size % PROBE_ALIGN
    done = 0
    t0 = time.perf_counter()
    try:
        while done < size:
            n = os.preadv(fd, [memoryview(buf)[: min(block, size - done)]], done)
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
        buf.close()
    return Bandwidth(done, time.perf_counter() - t0, direct)


def random_read(path: Path, record: int, queue_depth: int, seconds: float = 3.0,
                seed: int = 0) -> Bandwidth:
    """`queue_depth` threads each reading aligned `record`-sized blocks at random offsets."""
    record = (record + PROBE_ALIGN - 1) // PROBE_ALIGN * PROBE_ALIGN
    size = os.stat(path).st_size
    slots = size // record
    if slots < 1:
        raise ValueError(f"{path} is smaller than one record of {record} bytes")
    total = [0] * queue_depth
    direct_flags = [False] * queue_depth
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        fd, direct_flags[i] = _open(path)
        buf = mmap.mmap(-1, record)
        rng = random.Random(seed * 1000 + i)
        try:
            while time.perf_counter() < deadline:
                total[i] += os.preadv(fd, [buf], rng.randrange(slots) * record)
        finally:
            os.close(fd)
            buf.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(queue_depth)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Bandwidth(sum(total), time.perf_counter() - t0, all(direct_flags))
