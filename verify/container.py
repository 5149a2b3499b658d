"""`verify()`: check a container's header, index and, unless quick, every byte behind them."""

from __future__ import annotations

import time
from pathlib import Path

from moepack.format.limits import HEADER_SIZE
from moepack.verify.judge import HEADER_PADDING, judge
from moepack.verify.opening import Unverifiable, header_claim, open_for_verify
from moepack.verify.plan import build_items, tables_by_layer
from moepack.verify.reads import IoMode
from moepack.verify.report import Damage, Report
from moepack.verify.scan import Progress, scan

from moepack.sysinfo import usable_cores


def default_threads() -> int:
    """Usable cores (affinity and cgroup CPU quota: `moepack.sysinfo`)."""
    return usable_cores()


def _header_padding(path: str | Path, alignment: int, end: int) -> list[Damage]:
    """Damage for non-zero bytes in [HEADER_SIZE, alignment) (FORMAT.md caps alignment at
    16 MiB, so this read is small)."""
    stop = min(alignment, end)
    if stop <= HEADER_SIZE:
        return []
    with open(path, "rb") as f:
        f.seek(HEADER_SIZE)
        data = f.read(stop - HEADER_SIZE)
    stripped = data.lstrip(b"\0")
    if not stripped:
        return []
    lo = HEADER_SIZE + len(data) - len(stripped)
    hi = HEADER_SIZE + len(data.rstrip(b"\0"))
    return [Damage("padding", "padding", lo, hi - lo,
                   f"non-zero bytes in the gap {HEADER_SIZE}..{alignment}", HEADER_PADDING)]


def verify(path: str | Path, *, quick: bool = False, threads: int | None = None,
           progress: Progress | None = None, io: IoMode = "auto") -> Report:
    """Verify a container. `quick`: header, index and root hash only.

    `threads`: hashing threads (default: usable cores). `progress(done, total)` is called after
    each chunk. `io`: "direct" (O_DIRECT, falls back when unsupported), "buffered", or "auto"
    (page cache when the file is mostly cached, else O_DIRECT).
    """
    t0 = time.perf_counter()
    try:
        opened = open_for_verify(path)
    except Unverifiable as e:
        r = Report.unverifiable(path, str(e), code=e.code, quick=quick)
        r.claimed_container_id = header_claim(path)
        return r
    h = opened.header
    report = Report(str(path), quick, container_id=opened.container_id,
                    damaged=list(opened.damage), notes=list(opened.notes))
    report.items_checked = 1
    report.bytes_checked = HEADER_SIZE
    if h is not None:
        report.items_checked += 1
        report.bytes_checked += h.index_length
    if quick and h is not None:
        # The reader refuses non-zero bytes here at open time, so quick checks them too.
        try:
            report.damaged += _header_padding(path, h.alignment, h.index_offset)
        except OSError as e:
            return Report.unverifiable(path, f"cannot read: {e.strerror or e}")
        report.bytes_checked += max(0, min(h.alignment, h.index_offset) - HEADER_SIZE)
    if not quick and h is not None and opened.sections is not None:
        items = build_items(opened.sections, HEADER_SIZE, h.index_offset)
        try:
            res = scan(path, items, HEADER_SIZE, h.index_offset,
                       threads=threads or default_threads(), mode=io, progress=progress)
        except OSError as e:
            return Report.unverifiable(path, f"cannot read: {e.strerror or e}")
        damage, notes = judge(items, res, tables_by_layer(opened.sections),
                              alignment=h.alignment)
        report.damaged += damage
        report.notes += notes
        report.items_checked += sum(1 for it in items if it.check in ("hash", "record"))
        report.bytes_checked += res.bytes_read
        report.direct_io = res.direct
    report.damaged.sort(key=lambda d: d.offset)
    report.seconds = time.perf_counter() - t0
    return report
