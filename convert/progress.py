"""Progress display of a conversion: rich bars on stderr, or nothing (`--quiet`, `--json`)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter:
    """Silent base: the pipeline calls these hooks; subclasses show them."""

    def message(self, text: str) -> None: ...
    def hashing(self, total: int) -> None: ...
    def hashed(self, nbytes: int) -> None: ...
    def start(self, layers: tuple[int, int], experts: tuple[int, int],
              nbytes: tuple[int, int]) -> None: ...
    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None: ...
    def stop(self) -> None: ...


class RichReporter(Reporter):
    """Bars for layers, experts and bytes written (with MB/s); ETA from rich's speed estimate."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console)
        self._ids: dict[str, TaskID] = {}

    def message(self, text: str) -> None:
        self.console.print(text)

    def _bar(self, key: str, desc: str, done: int, total: int) -> None:
        if not self.progress.live.is_started:
            self.progress.start()
        self._ids[key] = self.progress.add_task(desc, total=total, completed=done, extra="")

    def hashing(self, total: int) -> None:
        self._bar("source", "sha256", 0, total)

    def hashed(self, nbytes: int) -> None:
        self.progress.advance(self._ids["source"], nbytes)

    def start(self, layers, experts, nbytes) -> None:
        self._bar("layers", "layers", *layers)
        self._bar("experts", "experts", *experts)
        self._bar("bytes", "bytes", *nbytes)

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        for key, n in (("layers", layers), ("experts", experts), ("bytes", nbytes)):
            if n:
                self.progress.advance(self._ids[key], n)
        task = next(t for t in self.progress.tasks if t.id == self._ids["bytes"])
        self.progress.update(task.id, extra=f"{(task.speed or 0.0) / 1e6:,.2f} MB/s")

    def stop(self) -> None:
        if self.progress.live.is_started:
            self.progress.stop()
