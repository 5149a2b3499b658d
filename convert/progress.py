"""Progress display of a conversion: rich bars on stderr, or nothing (`--quiet`, `--json`)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter:
    """Silent base: the pipeline calls these hooks; subclasses show them."""

    def message(self, text: str) -> None: ...
    def hashing(self, total: int, label: str = "sha256") -> None: ...
    def hashed(self, nbytes: int) -> None: ...
    def start(self, layers: tuple[int, int], experts: tuple[int, int],
              nbytes: tuple[int, int]) -> None: ...
    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None: ...
    def transfer(self, downloaded: int, staged: int) -> None: ...   # hub sources: shard bytes
    def stop(self) -> None: ...


class RichReporter(Reporter):
    """Bars for layers, experts and bytes written (with MB/s); ETA from rich's speed estimate;
    for hub sources a row of shard bytes downloaded and on disk."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description:<8}"), BarColumn(), TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console)
        self._ids: dict[str, TaskID] = {}

    def message(self, text: str) -> None:
        self.console.print(text)

    def _bar(self, key: str, desc: str, done: int, total: int) -> None:
        if not self.progress.live.is_started:
            self.progress.start()
        self._ids[key] = self.progress.add_task(desc, total=total, completed=done, extra="")
        self._label(key)

    def _label(self, key: str) -> None:
        task = next(t for t in self.progress.tasks if t.id == self._ids[key])
        if key in ("bytes", "source"):
            text = (f"{task.completed / 1e6:,.1f}/{(task.total or 0) / 1e6:,.1f} MB "
                    f"{(task.speed or 0.0) / 1e6:,.2f} MB/s")
        else:
            text = f"{int(task.completed)}/{int(task.total or 0)}"
        self.progress.update(task.id, extra=text)

    def hashing(self, total: int, label: str = "sha256") -> None:
        self._bar("source", label, 0, total)

    def hashed(self, nbytes: int) -> None:
        self.progress.advance(self._ids["source"], nbytes)
        self._label("source")

    def start(self, layers, experts, nbytes) -> None:
        self._bar("layers", "layers", *layers)
        self._bar("experts", "experts", *experts)
        self._bar("bytes", "bytes", *nbytes)

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        for key, n in (("layers", layers), ("experts", experts), ("bytes", nbytes)):
            if n:
                self.progress.advance(self._ids[key], n)
                self._label(key)

    def transfer(self, downloaded: int, staged: int) -> None:
        if "shards" not in self._ids:
            if not self.progress.live.is_started:
                self.progress.start()
            self._ids["shards"] = self.progress.add_task("shards", total=None, extra="")
        self.progress.update(self._ids["shards"], extra=f"downloaded {downloaded / 1e6:,.1f} MB, "
                             f"on disk {staged / 1e6:,.1f} MB")

    def stop(self) -> None:
        if self.progress.live.is_started:
            self.progress.stop()
