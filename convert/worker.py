"""Runs conversion tasks: encode trunk tensors, train a layer's codebooks, encode its experts,
pwrite everything at planned offsets, and report finished units only once they are durable."""

from __future__ import annotations

import ctypes
import os
import re
import resource
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import blake3
from moepack.convert.adapters import EXPERT_PARTS
from moepack.convert.encoding import (
    Codebook,
    encode_expert,
    encode_trunk,
    stored_codebook,
    train_codebook,
)
from moepack.convert.errors import ConvertError
from moepack.convert.quant import RvqSettings
from moepack.convert.source import Checkpoint, SourceRef
from moepack.convert.tasks import Task, expert_unit, tensor_unit
from moepack.format import ContainerWriter, Layout, TensorSpec

from moepack.durable import naming

FLUSH_BYTES = 64 << 20   # fsync + journal at least this often (bounded redo after a crash)
FLUSH_SECONDS = 2.0

# Messages to the coordinator: ("units", [(unit, hex)], nbytes, experts)
#                              | ("task_done", key, peak_rss_bytes) | ("error", key, text)
Emit = Callable[[tuple], None]


@dataclass(frozen=True)
class WorkerConfig:
    src: Path
    out: Path
    layout: Layout
    rvq: RvqSettings
    seed: int
    threads: int
    overwrite: bool
    codebook_names: dict[int, dict[str, tuple[str, str | None]]]
    # > 0: journal after every unit and pause this many seconds (lets tests interrupt at a
    # chosen point; `moepack convert --pause-per-unit`, hidden)
    pause_per_unit: float = 0.0


class Worker:
    def __init__(self, cfg: WorkerConfig, emit: Emit) -> None:
        self.cfg, self.emit = cfg, emit
        self.ck = Checkpoint(cfg.src)
        self.writer = ContainerWriter(cfg.out, cfg.layout, create=False, overwrite=cfg.overwrite)
        self._sync_fd = os.open(self.writer.partial, os.O_RDONLY)
        self._pending: list[tuple[str, str]] = []
        self._pending_bytes = 0
        self._pending_experts = 0
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.writer.close()
        os.close(self._sync_fd)

    # -- durability ----------------------------------------------------------------------
    def _done(self, unit: str, digest: bytes, nbytes: int, experts: int = 0) -> None:
        self._pending.append((unit, digest.hex()))
        self._pending_bytes += nbytes
        self._pending_experts += experts
        pause = self.cfg.pause_per_unit
        if (pause or self._pending_bytes >= FLUSH_BYTES
                or time.monotonic() - self._last_flush >= FLUSH_SECONDS):
            self.flush()
            time.sleep(pause)

    def flush(self) -> None:
        if not self._pending:
            return
        with naming(self.writer.partial):
            os.fsync(self._sync_fd)  # the data first; the coordinator journals it afterwards
        self.emit(("units", self._pending, self._pending_bytes, self._pending_experts))
        self._pending, self._pending_bytes, self._pending_experts = [], 0, 0
        self._last_flush = time.monotonic()

    # -- work ----------------------------------------------------------------------------
    def run(self, task: Task, done: dict[str, str]) -> None:
        for job in task.trunk:
            unit = tensor_unit(job.name)
            if unit in done:
                continue
            data = self._encode_trunk(job.codec, job.ref)
            self._done(unit, self.writer.write_tensor(job.name, data), len(data))
        if task.layer is not None:
            todo = [(e, refs) for e, refs in task.experts if expert_unit(task.layer, e) not in done]
            if todo:
                self._experts(task, todo, done)
        self.flush()

    def _experts(self, task: Task, todo: list, done: dict[str, str]) -> None:
        layer = task.layer
        assert layer is not None
        bank = self.cfg.layout.bank(layer)
        books = {part: self._codebook(task, part, done) for part in EXPERT_PARTS}
        for e, refs in todo:
            record = encode_expert(self.ck, bank, refs, books, self.cfg.rvq, self.cfg.threads)
            digest = self.writer.write_expert(layer, e, record)
            self._done(expert_unit(layer, e), digest, bank.stride, 1)

    def _encode_trunk(self, codec: dict, ref: SourceRef) -> bytes | bytearray:
        return encode_trunk(self.ck, codec, ref, self.cfg.threads)

    def _codebook(self, task: Task, part: str, done: dict[str, str]) -> Codebook:
        layer = task.layer
        assert layer is not None
        cb_name, rot_name = self.cfg.codebook_names[layer][part]
        if tensor_unit(cb_name) in done and (rot_name is None or tensor_unit(rot_name) in done):
            stages = self.cfg.layout.bank(layer).parts[EXPERT_PARTS.index(part)].codec["stages"]
            return read_codebook(self.cfg.layout, self._sync_fd, self.writer.partial,
                                 (cb_name, rot_name), stages, done)
        book = train_codebook(self.ck, self.cfg.layout.bank(layer), part, dict(task.experts),
                              self.cfg.rvq, self.cfg.seed, self._spec(cb_name).codec,
                              rot_name is not None, self.cfg.threads)
        self._done(tensor_unit(cb_name), self.writer.write_tensor(cb_name, book.data),
                   len(book.data))
        if rot_name is not None and book.rotation is not None:
            self._done(tensor_unit(rot_name), self.writer.write_tensor(rot_name, book.rotation),
                       len(book.rotation))
        return book

    def _spec(self, name: str) -> TensorSpec:
        return spec_of(self.cfg.layout, name)


def spec_of(layout: Layout, name: str) -> TensorSpec:
    return next(t for t in layout.spec.tensors if t.name == name)


def read_codebook(layout: Layout, fd: int, partial: Path, names: tuple[str, str | None],
                  stages: int, done: dict[str, str]) -> Codebook:
    """A codebook (and rotation) written by an earlier run, checked against the journal."""
    def read(name: str) -> bytes:
        ext = layout.tensor(name)
        data = os.pread(fd, ext.length, ext.offset)
        if blake3.blake3(data).hexdigest() != done[tensor_unit(name)]:
            raise ConvertError(f"{partial}: {name} differs from the journal; "
                               "rerun with --restart to start this conversion over")
        return data

    cb_name, rot_name = names
    cb = spec_of(layout, cb_name)
    rot = None if rot_name is None else read(rot_name)
    cols = 0 if rot_name is None else spec_of(layout, rot_name).shape[0]
    return stored_codebook(cb.codec, tuple(cb.shape), stages, read(cb_name), rot, cols)


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def interrupted(exc: BaseException) -> bool:
    """Ctrl-C that arrives while ctypes converts a native call's arguments surfaces as a
    ctypes.ArgumentError naming KeyboardInterrupt, not as KeyboardInterrupt itself."""
    return isinstance(exc, ctypes.ArgumentError) and \
        re.match(r"argument \d+: KeyboardInterrupt\b", str(exc)) is not None


def describe(exc: BaseException) -> str:
    if isinstance(exc, (ConvertError, OSError)):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip() + "\n" + \
        "".join(traceback.format_tb(exc.__traceback__)[-3:])


def process_main(cfg: WorkerConfig, done: dict[str, str], conn) -> None:
    """Entry point of a worker process (spawned): run the tasks the coordinator sends over
    `conn` until a None arrives, sending every report back over it."""
    _die_with_parent()
    # Ctrl-C reaches the whole process group: the coordinator alone handles it (and stops us),
    # so the run says "interrupted" rather than relaying a worker's traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = None
    key = "startup"
    try:
        worker = Worker(cfg, conn.send)
        while (task := _next_task(conn)) is not None:
            key = task.key
            worker.run(task, done)
            conn.send(("task_done", key, peak_rss()))
    except BaseException as e:  # reported to the coordinator, which stops the run
        conn.send(("error", key, describe(e)))
    finally:
        if worker is not None:
            worker.close()


def _next_task(conn) -> Task | None:
    """The coordinator's next task; None also when it has gone (nobody left to report to)."""
    try:
        return conn.recv()
    except EOFError:
        return None


def _die_with_parent() -> None:
    """Linux: get SIGKILLed when the coordinator dies, so no orphan keeps writing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
