"""Waves of a streamed conversion (`hf:ORG/REPO --staging SIZE`, convert/stream.py): which
shards each piece of work reads, pieces grouped into waves that fill at most half the bound, and
the executor that runs a wave on the local workers while the next wave's shards download beside
it. Room is made by turning real shards back into stand-ins (sparse files holding just the
safetensors header), the one needed again last first, never one the running wave reads; room is
reserved before a download starts, so real shards never exceed the bound.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from moepack.convert.errors import ConvertError
from moepack.convert.progress import Reporter
from moepack.convert.runner import run_tasks
from moepack.convert.source import Checkpoint
from moepack.convert.st_header import MAX_HEADER
from moepack.convert.tasks import Task, expert_unit, tensor_unit
from moepack.convert.worker import WorkerConfig


class Downloads(Protocol):
    """The hub repository as the executor uses it (convert/stream.py's _Hub)."""

    stage: Path

    def verified(self, name: str) -> bool: ...
    def download(self, name: str) -> int: ...


@dataclass
class StreamStats:
    staging_bound: int
    source_bytes: int = 0          # all weight shards
    downloaded: int = 0            # weight-shard bytes downloaded by this run
    shards_downloaded: int = 0
    peak_staged: int = 0           # most real shard bytes on disk at once
    waves: int = 0
    prefetched: int = 0            # shards downloaded while a wave was encoding
    fetched_by_node: dict[str, int] = field(default_factory=dict)  # --ray: range bytes per node


def write_standin(stage: Path, name: str, header: bytes, size: int) -> None:
    """NAME becomes a sparse file of `size` bytes holding just `header` (atomic replace)."""
    from moepack.safefs import write_file

    tmp = stage / f".{name}.standin"
    write_file(tmp, header)
    os.truncate(tmp, size)
    os.replace(tmp, stage / name)


def read_prefix(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head)
        return head + f.read(min(n, MAX_HEADER))


class ShardIndex:
    """Which weight shards each source tensor lives in (a tensor and its companions: fp8
    `_scale_inv`, packed `_packed`/`_scale`/`_shape` share its name as a prefix)."""

    def __init__(self, ck: Checkpoint) -> None:
        self.names = sorted(ck.tensors)
        self.file = {n: ck.tensors[n].file for n in self.names}

    def of(self, names: Iterable[str]) -> frozenset[str]:
        out = set()
        for name in names:
            i = bisect.bisect_left(self.names, name)
            while i < len(self.names) and self.names[i].startswith(name):
                out.add(self.file[self.names[i]])
                i += 1
        return frozenset(out)


Piece = tuple[Task, frozenset]


def pieces(tasks: list[Task], done: Mapping[str, str], files: ShardIndex) -> list[Piece]:
    """Tasks split into what can run apart: each missing trunk tensor, and a MoE layer's
    codebooks + missing experts (training samples all its experts, so they stay together)."""
    out = []
    for t in tasks:
        for job in t.trunk:
            if tensor_unit(job.name) not in done:
                out.append((Task(t.key, (job,)), files.of([job.ref.name])))
        if t.layer is not None and any(expert_unit(t.layer, e) not in done for e, _ in t.experts):
            names = [r.name for _, refs in t.experts for r in refs.values()]
            out.append((Task(t.key, (), t.layer, t.experts), files.of(names)))
    return out


def plan_waves(work: list[Piece], sizes: Mapping[str, int],
               bound: int) -> list[tuple[list[Piece], frozenset]]:
    """Pieces grouped in order into waves whose shards fill at most half the bound (a piece
    that needs more is a wave alone), so the next wave's shards can download while one runs."""
    waves: list[tuple[list[Piece], frozenset]] = []
    for piece in work:
        if waves:
            wave, need = waves[-1]
            if sum(sizes[n] for n in need | piece[1]) <= bound // 2:
                waves[-1] = (wave + [piece], need | piece[1])
                continue
        waves.append(([piece], piece[1]))
    return waves


def in_order(names: Iterable[str], wave: list[Piece]) -> list[str]:
    """`names` in the order the wave's pieces first use them."""
    return sorted(names, key=lambda n: min(i for i, (_, nd) in enumerate(wave) if n in nd))


class StreamExecutor:
    def __init__(self, hub: Downloads, sizes: Mapping[str, int], bound: int, jobs: int,
                 rep: Reporter, stats: StreamStats) -> None:
        self.hub, self.sizes, self.bound, self.jobs = hub, sizes, bound, jobs
        self.rep, self.stats = rep, stats
        self.prefetch_error: BaseException | None = None
        self.uses: dict[str, list[int]] = {}   # shard -> the waves that need it, ascending

    def real(self) -> set[str]:
        return {n for n in self.sizes if self.hub.verified(n)}

    def execute(self, cfg: WorkerConfig, tasks: list[Task], done: dict[str, str],
                on_message: Callable[[tuple], None]) -> None:
        work = pieces(tasks, done, ShardIndex(Checkpoint(cfg.src)))
        for _, need in work:
            if sum(self.sizes[n] for n in need) > self.bound:
                raise ConvertError(
                    f"--staging {self.bound:,} bytes is too small: one task needs "
                    f"{sum(self.sizes[n] for n in need):,} bytes of shards at once "
                    f"({', '.join(sorted(need))})")
        left: dict[str, int] = {}
        for t, _ in work:
            left[t.key] = left.get(t.key, 0) + 1
        rss: dict[str, int] = {}

        def relay(msg: tuple) -> None:  # one "task_done" per original task, as the bars expect
            if msg[0] != "task_done":
                on_message(msg)
                return
            rss[msg[1]] = max(rss.get(msg[1], 0), msg[2])
            left[msg[1]] -= 1
            if left[msg[1]] == 0:
                on_message(("task_done", msg[1], rss[msg[1]]))

        waves = plan_waves(work, self.sizes, self.bound)
        self.uses = {}
        for k, (_, need) in enumerate(waves):
            for name in need:
                self.uses.setdefault(name, []).append(k)
        self._drop_partials(waves[0][1])
        for k, (wave, need) in enumerate(waves):
            for name in in_order(need - self.real(), wave):  # what no prefetch brought
                self._make_room(name, need, k)
                self._fetch(cfg.src, name)
            later = waves[k + 1] if k + 1 < len(waves) else ([], frozenset())
            prefetch = threading.Thread(target=self._prefetch, name="moepack-prefetch",
                                        args=(cfg.src, in_order(later[1] - self.real(), later[0]),
                                              need, k + 1),
                                        daemon=True)  # an error stops the run, not a download
            self.prefetch_error = None
            prefetch.start()
            self.stats.waves += 1
            run_tasks(cfg, [t for t, _ in wave], done, self.jobs, relay)
            prefetch.join()
            if self.prefetch_error is not None:
                raise self.prefetch_error
        for name in self.real():
            self._release(name)

    def _prefetch(self, stage: Path, names: list[str], running: frozenset, k: int) -> None:
        """While a wave runs: download wave k's shards, in order, as long as room can be made
        without touching the running wave's shards (the rest is downloaded after the wave)."""
        try:
            for name in names:
                if not self._make_room(name, running, k):
                    return
                self._fetch(stage, name)
                self.stats.prefetched += 1
        except BaseException as e:  # raised by the coordinator after the wave
            self.prefetch_error = e

    def _next_use(self, name: str, k: int) -> float:
        uses = self.uses.get(name, [])
        i = bisect.bisect_left(uses, k)
        return uses[i] if i < len(uses) else float("inf")

    def _make_room(self, name: str, protect: frozenset, k: int) -> bool:
        """Room for shard `name` (next used by wave k) within the bound: release shards not in
        `protect`, the one used again last first, never one needed sooner than `name`."""
        real = self.real()
        free = self.bound - sum(self.sizes[n] for n in real)
        for victim in sorted(real - protect, key=lambda n: -self._next_use(n, k)):
            if free >= self.sizes[name] or self._next_use(victim, k) <= k:
                break
            self._release(victim)
            free += self.sizes[victim]
        return free >= self.sizes[name]

    def _release(self, name: str) -> None:
        path = self.hub.stage / name
        write_standin(self.hub.stage, name, read_prefix(path), self.sizes[name])
        self.rep.transfer(self.stats.downloaded, sum(self.sizes[n] for n in self.real()))

    def _drop_partials(self, keep: frozenset) -> None:
        """An interrupted prefetch's NAME.incomplete would sit beside the first wave's shards,
        over the bound: it goes (at most one shard of download is redone)."""
        for name in set(self.sizes) - keep:
            part = self.hub.stage / f"{name}.incomplete"
            if part.is_file() and not part.is_symlink():
                part.unlink()

    def _fetch(self, stage: Path, name: str) -> None:
        standin = read_prefix(stage / name)
        self.rep.message(f"downloading {name} ({self.sizes[name]:,} bytes)")
        self.stats.downloaded += self.hub.download(name)
        self.stats.shards_downloaded += 1
        if read_prefix(stage / name) != standin:
            raise ConvertError(f"{name}: the downloaded file's header differs from the header "
                               "the hub served for planning; remove the staging folder "
                               f"{stage} and rerun")
        staged = sum(self.sizes[n] for n in self.real())
        self.stats.peak_staged = max(self.stats.peak_staged, staged)
        self.rep.transfer(self.stats.downloaded, staged)
