"""One sequential pass over the items: read big chunks, hash each item, check gaps are zero.

Parallelism: items that fall inside one chunk are independent, so a chunk's segments are split
into `threads` contiguous groups run on a thread pool (BLAKE3 releases the GIL); an item larger
than the chunk is hashed incrementally by one BLAKE3 hasher using its own multi-threading
(`max_threads`), which only pays above ~1 MiB per update. Reads of the next chunks are in flight
meanwhile (RangeReader).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import numpy as np
from moepack.verify.plan import Item
from moepack.verify.reads import CHUNK, IoMode, RangeReader

Progress = Callable[[int, int], None]  # (bytes done, bytes total)

_MT_MIN = 1 << 20  # items at least this big get a multi-threaded hasher


@dataclass
class ScanResult:
    digests: dict[int, bytes] = field(default_factory=dict)  # item index -> BLAKE3
    # item index -> [first, last + 1) of non-zero bytes in its padding (gaps, record padding)
    nonzero: dict[int, tuple[int, int]] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)  # item index -> why
    # unreadable item index -> the open-time rule the file now breaks (absent: plain I/O error)
    unreadable_codes: dict[int, str] = field(default_factory=dict)
    kept: dict[int, bytearray] = field(default_factory=dict)  # item index -> its bytes
    bytes_read: int = 0
    direct: bool = False


@dataclass(slots=True)
class _Segment:
    index: int
    item: Item
    data: memoryview
    offset: int  # file offset of data[0]
    first: bool
    last: bool


class _Hashing:
    """Per-item state across chunks, and the work on one segment."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.hashers: dict[int, blake3.blake3] = {}
        self.result = ScanResult()

    def _hasher(self, item: Item) -> blake3.blake3:
        mt = self.threads if self.threads > 1 and item.length >= _MT_MIN else 1
        return blake3.blake3(max_threads=mt)

    def _zero_check(self, index: int, data: memoryview, offset: int) -> None:
        """Record in `nonzero` the range of non-zero bytes of `data` (at file `offset`)."""
        arr = np.frombuffer(data, dtype=np.uint8)
        if not np.count_nonzero(arr):
            return
        where = np.flatnonzero(arr)
        lo, hi = offset + int(where[0]), offset + int(where[-1]) + 1
        old = self.result.nonzero.get(index)
        self.result.nonzero[index] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)

    def _record_padding(self, seg: _Segment) -> None:
        end = seg.offset + len(seg.data)
        for a, b in seg.item.zeros:
            lo, hi = max(seg.item.offset + a, seg.offset), min(seg.item.offset + b, end)
            if lo < hi:
                self._zero_check(seg.index, seg.data[lo - seg.offset:hi - seg.offset], lo)

    def run(self, seg: _Segment) -> None:
        item, res = seg.item, self.result
        if item.check == "zero":
            self._zero_check(seg.index, seg.data, seg.offset)
            return
        if item.check == "none":
            return
        if item.keep:
            res.kept.setdefault(seg.index, bytearray()).extend(seg.data)
        if item.zeros:
            self._record_padding(seg)
        if seg.first:
            h = self._hasher(item)
        else:
            h = self.hashers.pop(seg.index, None)
            if h is None:
                return  # an earlier part was unreadable
        h.update(seg.data)
        if seg.last:
            res.digests[seg.index] = h.digest()
        else:
            self.hashers[seg.index] = h

    def run_group(self, group: list[_Segment]) -> None:
        for seg in group:
            self.run(seg)

    def broken(self, index: int, why: str, code: str | None) -> None:
        self.hashers.pop(index, None)
        if index not in self.result.unreadable:
            self.result.unreadable[index] = why
            if code is not None:
                self.result.unreadable_codes[index] = code


def _groups(segs: list[_Segment], n: int) -> list[list[_Segment]]:
    """Split into at most n contiguous groups of about equal bytes."""
    total = sum(len(s.data) for s in segs)
    groups: list[list[_Segment]] = [[]]
    acc = 0
    for s in segs:
        if acc >= total * len(groups) / n and len(groups) < n:
            groups.append([])
        groups[-1].append(s)
        acc += len(s.data)
    return [g for g in groups if g]


def scan(path: str | Path, items: list[Item], start: int, end: int, *, threads: int = 1,
         mode: IoMode = "auto", progress: Progress | None = None, chunk: int = CHUNK) -> ScanResult:
    """Check every item in [start, end) (items contiguous and sorted); see ScanResult."""
    work = _Hashing(threads)
    res = work.result
    total = end - start
    i = 0
    ended: int | None = None  # where the file was first seen to end (it shrank while read)
    with RangeReader(path, start, end, mode=mode, chunk=chunk) as reader, \
            ThreadPoolExecutor(max(1, threads), thread_name_prefix="moepack-hash") as pool:
        for ch in reader.chunks():
            c0 = ch.offset
            c1 = min((c0 // chunk + 1) * chunk, end)
            avail = c0 + len(ch.data)
            if avail < c1 and not ch.error and ended is None:
                ended = avail  # later chunks read nothing: they start past the end, not at it
            why = f"read error at offset {c0}: {ch.error}" if ch.error else \
                f"file ended at offset {avail if ended is None else ended} during verification"
            # A file that shrank since it was opened breaks the header's file_size rule.
            why_code = None if ch.error else "file_size_mismatch"
            segs: list[_Segment] = []
            while i < len(items) and items[i].offset < c1:
                item = items[i]
                lo, hi = max(item.offset, c0), min(item.end, c1)
                if hi > avail:
                    work.broken(i, why, why_code)
                if i not in res.unreadable and min(hi, avail) > lo:
                    segs.append(_Segment(i, item, ch.data[lo - c0:min(hi, avail) - c0], lo,
                                         lo == item.offset, hi == item.end))
                if item.end > c1:
                    break
                i += 1
            groups = _groups(segs, threads) if threads > 1 else [segs]
            if len(groups) > 1:
                for f in [pool.submit(work.run_group, g) for g in groups]:
                    f.result()
            else:
                work.run_group(segs)
            res.bytes_read += avail - c0
            if progress is not None:
                progress(c1 - start, total)
        res.direct = reader.direct
    for j in range(i, len(items)):  # the reader stopped early: nothing left to read
        work.broken(j, f"file ended before offset {items[j].offset}", "file_size_mismatch")
    return res
