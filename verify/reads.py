"""Large aligned sequential reads of a byte range, with reads in flight while the caller hashes.

O_DIRECT skips the page cache (a cold multi-hundred-GB file would otherwise evict everything
else and be copied twice); it needs aligned offsets, lengths and buffers, so every read starts at
a multiple of the chunk size, lands in an mmap'd (page-aligned) buffer, and the caller gets a
slice of it. Filesystems without O_DIRECT (tmpfs, some FUSE) fail the open or the first read with
EINVAL: then the file is re-read through the page cache with POSIX_FADV_SEQUENTIAL.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from moepack.verify.residency import cached_fraction

from moepack.sysinfo import usable_memory

IoMode = Literal["auto", "direct", "buffered"]

CHUNK = 8 << 20  # bytes per read: large enough for full device speed, a multiple of any block size
# O_DIRECT reads kept in flight besides the chunk being hashed (os.preadv releases the GIL).
# Buffered reads ("auto" picks them for cached files) are made in the hashing thread: the copied
# chunk stays in that core's cache (measured on a warm file: ~2.8 vs ~2.3 GB hashed per
# CPU-second with reader threads).
DEPTH = 2
# "auto": O_DIRECT unless most of the range is in the page cache; when residency is unknown,
# O_DIRECT only for files that could not stay cached anyway.
_CACHED_ENOUGH = 0.5
_DIRECT_FRACTION_OF_RAM = 0.5


@dataclass
class Chunk:
    """File bytes [offset, offset + len(data)); `error` says why the rest could not be read."""

    offset: int
    data: memoryview
    error: OSError | None = None


def _available_ram() -> int:
    """Usable memory (MemAvailable and cgroup limit: `moepack.sysinfo`); 0 if unknown."""
    return usable_memory() or 0


def choose_direct(mode: IoMode, path: str | Path, start: int, end: int) -> bool:
    """Whether to try O_DIRECT for [start, end) of `path` (see the "auto" rule above)."""
    if mode == "direct":
        return True
    if mode == "buffered":
        return False
    cached = cached_fraction(path, start, end)
    if cached is not None:
        return cached < _CACHED_ENOUGH
    ram = _available_ram()
    return ram > 0 and end - start > ram * _DIRECT_FRACTION_OF_RAM


class RangeReader:
    """Reads [start, end) of a file in aligned chunks; iterate with `chunks()`; then `close()`."""

    def __init__(self, path: str | Path, start: int, end: int, *, mode: IoMode = "auto",
                 chunk: int = CHUNK, depth: int | None = None) -> None:
        if chunk <= 0 or chunk % mmap.PAGESIZE:
            raise ValueError(f"chunk {chunk} must be a positive multiple of {mmap.PAGESIZE}")
        self.path = Path(path)
        self.start, self.end, self.chunk = start, end, chunk
        self._buffered_fd = os.open(self.path, os.O_RDONLY)
        self._direct_fd: int | None = None
        if choose_direct(mode, self.path, start, end) and hasattr(os, "O_DIRECT"):
            try:
                self._direct_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                self._direct_fd = None
        # Falling back only flips this flag: reads in flight on the other fd stay valid.
        self._use_direct = self._direct_fd is not None
        if not self._use_direct:
            self._advise_sequential()
        # None: in flight only for O_DIRECT; 0: read in the caller's thread.
        self.depth = max(0, depth) if depth is not None else (DEPTH if self.direct else 0)

    @property
    def direct(self) -> bool:
        """True while reads bypass the page cache."""
        return self._use_direct

    def _advise_sequential(self) -> None:
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(self._buffered_fd, self.start, self.end - self.start,
                                 os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass  # advice only

    def _read(self, buf: mmap.mmap, offset: int, want: int) -> Chunk:
        """Fill buf with up to `want` bytes at `offset`; short only at end of file."""
        view = memoryview(buf)
        got = 0
        while got < want:
            direct = self._use_direct
            fd = self._direct_fd if direct and self._direct_fd is not None else self._buffered_fd
            try:
                # O_DIRECT reads whole aligned blocks; the caller slices what it asked for.
                n = os.preadv(fd, [view[got:self.chunk]], offset + got)
            except OSError as e:
                if e.errno == errno.EINVAL and direct:
                    if self._use_direct:
                        self._use_direct = False
                        self._advise_sequential()
                    continue
                return Chunk(offset, view[:0], e)
            if n == 0:
                break
            got += n
            if direct and got % mmap.PAGESIZE:
                break  # a short O_DIRECT read ends at end of file
        return Chunk(offset, view[:min(got, want)])

    def _trimmed(self, got: Chunk) -> Chunk:
        lo = max(self.start - got.offset, 0)  # only the first chunk starts early
        return Chunk(got.offset + lo, got.data[lo:], got.error)

    def chunks(self) -> Iterator[Chunk]:
        """Chunks covering [start, end) in order; each is valid until the next one is requested."""
        first = self.start - self.start % self.chunk
        offsets = range(first, self.end, self.chunk)
        if self.depth == 0:
            buf = mmap.mmap(-1, self.chunk)
            try:
                for off in offsets:
                    yield self._trimmed(self._read(buf, off, min(self.chunk, self.end - off)))
            finally:
                try:
                    buf.close()
                except BufferError:
                    pass  # a caller still holds a view; the GC frees it later
            return
        buffers = [mmap.mmap(-1, self.chunk) for _ in range(self.depth + 1)]
        free = deque(buffers)
        pending: deque[tuple[Future[Chunk], mmap.mmap]] = deque()
        it = iter(offsets)
        with ThreadPoolExecutor(self.depth, thread_name_prefix="moepack-read") as pool:
            try:
                while True:
                    while free and len(pending) < self.depth:
                        off = next(it, None)
                        if off is None:
                            break
                        buf = free.popleft()
                        want = min(self.chunk, self.end - off)
                        pending.append((pool.submit(self._read, buf, off, want), buf))
                    if not pending:
                        return
                    fut, buf = pending.popleft()
                    yield self._trimmed(fut.result())
                    free.append(buf)
            finally:
                for fut, _ in pending:
                    fut.cancel()
                for fut, _ in pending:
                    if not fut.cancelled():
                        fut.exception()  # wait: a buffer must not be unmapped under a read
                for b in buffers:
                    try:
                        b.close()
                    except BufferError:
                        pass  # a caller still holds a view; the GC frees it later

    def close(self) -> None:
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None
        os.close(self._buffered_fd)

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
