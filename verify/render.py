"""Human-readable output of verification reports, and the progress bar for long runs."""

from __future__ import annotations

import time
from types import TracebackType

from moepack.verify.report import Report
from moepack.verify.source import SourceReport
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

_SHOW_AFTER_S = 1.0  # short runs finish before a bar would be readable


class LazyProgress:
    """A `progress(done, total)` callback that shows a rich bar (with GB/s) only on long runs."""

    def __init__(self, console: Console, label: str) -> None:
        self.console, self.label = console, label
        self.t0 = time.monotonic()
        self.bar: Progress | None = None
        self.task = 0

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.monotonic() - self.t0 < _SHOW_AFTER_S:
                return
            self.bar = Progress(
                "[progress.description]{task.description}", BarColumn(), TaskProgressColumn(),
                DownloadColumn(binary_units=False), TransferSpeedColumn(), TimeRemainingColumn(),
                console=self.console, transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def __enter__(self) -> LazyProgress:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.stop()


def _range(offset: int, length: int) -> str:
    return f"bytes {offset}..{offset + length} ({length:,} byte{'' if length == 1 else 's'})"


def print_report(r: Report, out: Console) -> None:
    if r.error is not None:
        # one line, as every refusal, the rule's code at its end: the ID an intact header
        # claims goes before the code
        claim = (f"; its intact header names container {r.claimed_container_id} (unverified)"
                 if r.claimed_container_id else "")
        code = f" {escape(f'[{r.error_code}]')}" if r.error_code else ""
        out.print(f"[red]not verifiable:[/red] {escape(r.path)}: {escape(r.error)}{claim}{code}")
        return
    out.print(f"container {r.container_id or '(unknown: header damaged)'}")
    mode = "quick (header, index, root hash)" if r.quick else \
        ("full, O_DIRECT" if r.direct_io else "full, buffered")
    out.print(f"checked {r.items_checked:,} items, {r.bytes_checked:,} bytes in {r.seconds:.2f} s "
              f"({r.gb_per_s:.2f} GB/s), {mode}")
    for note in r.notes:
        out.print(f"[yellow]note:[/yellow] {escape(note)}")
    if not r.damaged:
        out.print("[green]OK: intact[/green]")
        return
    out.print(f"[red]DAMAGED: {len(r.damaged)} item(s)[/red]")
    width = max(len(d.label) for d in r.damaged)
    for d in r.damaged:
        code = f"  {escape(f'[{d.code}]')}" if d.code else ""
        detail = f"  {escape(d.detail)}" if d.detail else ""
        out.print(f"  {escape(d.label):<{width}}  {_range(d.offset, d.length)}{code}{detail}")


def print_source_report(r: SourceReport, out: Console) -> None:
    if r.error is not None:
        out.print(f"[red]not verifiable:[/red] {escape(r.dir)}: {escape(r.error)}")
        return
    gbs = r.bytes_checked / r.seconds / 1e9 if r.seconds > 0 else 0.0
    out.print(f"source {escape(r.dir)} against {escape(r.expect)}")
    out.print(f"checked {r.files_checked} files, hashed {r.bytes_checked:,} bytes in "
              f"{r.seconds:.2f} s ({gbs:.2f} GB/s)")
    if r.size_only:
        out.print(f"[yellow]note:[/yellow] {len(r.size_only)} file(s) listed without a hash: "
                  "size checked only")
    for name in r.extra:
        out.print(f"[yellow]extra:[/yellow] {escape(name)} (not listed)")
    if not r.problems:
        out.print("[green]OK: every listed file is present and matches[/green]")
        return
    out.print(f"[red]PROBLEMS: {len(r.problems)} file(s)[/red]")
    for p in r.problems:
        sizes = ""
        if p.kind in ("truncated", "oversized"):
            sizes = f" ({p.actual_size:,} bytes, expected {p.expected_size:,})"
        detail = f": {escape(p.detail)}" if p.detail else ""
        out.print(f"  {p.kind:<10} {escape(p.name)}{sizes}{detail}")
