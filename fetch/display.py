"""Rich rendering shared by the fetch, torrent and seed commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from moepack.fetch.space import SAFETY_MARGIN, SpaceVerdict
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from moepack.cliargs import one_line
from moepack.sizes import format_size

console = Console()


def verdict_table(rows: list[SpaceVerdict]) -> Table:
    t = Table(title=f"space (needed includes a {SAFETY_MARGIN:.0%} safety margin)")
    for col in ("for", "filesystem of", "needed", "free", "verdict"):
        t.add_column(col)
    for v in rows:
        short = format_size(v.need_with_margin - v.free)
        t.add_row(v.label, escape(one_line(str(v.path))), format_size(v.need_with_margin),
                  format_size(v.free),
                  "[green]fits[/]" if v.ok else f"[red]short by {short}[/]")
    return t


@contextmanager
def transfer_bar(description: str, total: int) -> Iterator[tuple[Progress, int]]:
    """A bar with bytes, rate, ETA and a free-text field for peers/state."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                   TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                   console=console, transient=False)
    with bar:
        yield bar, bar.add_task(description, total=total, info="")
