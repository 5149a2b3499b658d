"""Runs conversion tasks: encode trunk tensors, train a layer's codebooks, encode its experts,
pwrite everything at planned offsets, and report finished units only once they are durable."""

from __future__ import annotations

import os
import resource
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import blake3
import numpy as np
from moepack.convert.adapters import EXPERT_PARTS
from moepack.convert.errors import ConvertError, SourceError
from moepack.convert.quant import RvqSettings, encode, layer_seed, train_layer
from moepack.convert.rowchunks import encode_by_rows
from moepack.convert.source import Checkpoint, SourceRef
from moepack.convert.tasks import Task, expert_unit, tensor_unit
from moepack.format import ContainerWriter, Layout, TensorSpec, pack_record
from moepack.format.codecs import decode

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
        codecs = {p.name: p.codec for p in bank.parts}
        books = {part: self._codebook(task, part, codecs[part], done) for part in EXPERT_PARTS}
        for e, refs in todo:
            parts = {}
            for part in EXPERT_PARTS:
                cb, signs = books[part]
                parts[part] = self._encode(codecs[part], refs[part], codebook=cb, rotation=signs,
                                           settings=self.cfg.rvq)
            digest = self.writer.write_expert(layer, e, pack_record(bank, parts))
            self._done(expert_unit(layer, e), digest, bank.stride, 1)

    @contextmanager
    def _naming(self, ref: SourceRef) -> Iterator[None]:
        """Encoder complaints (e.g. inf/NaN weights) name the tensor and its file."""
        try:
            yield
        except ValueError as e:
            raise SourceError(f"{self.ck.info(ref.name).file}: tensor {ref.name!r}: {e}") from e

    def _encode(self, codec: dict, ref: SourceRef, **kw) -> bytes:
        w = self.ck.read(ref)
        with self._naming(ref):
            return encode(codec, w, threads=self.cfg.threads, **kw)

    def _encode_trunk(self, codec: dict, ref: SourceRef) -> bytes | bytearray:
        """Large 2-D tensors are read and encoded in row bands (bounded memory)."""
        def band(lo: int, hi: int) -> np.ndarray:
            return self.ck.read(SourceRef(ref.name, rows=(lo, hi)))

        with self._naming(ref):
            return encode_by_rows(codec, self.ck.ref_shape(ref), band, threads=self.cfg.threads)

    def _codebook(self, task: Task, part: str, codec: dict,
                  done: dict[str, str]) -> tuple[np.ndarray, np.ndarray | None]:
        layer = task.layer
        assert layer is not None
        cb_name, rot_name = self.cfg.codebook_names[layer][part]
        if tensor_unit(cb_name) in done and (rot_name is None or tensor_unit(rot_name) in done):
            cb = self._read_back(cb_name, done).reshape(codec["stages"], 256, -1)
            return cb, (self._read_back(rot_name, done) if rot_name else None)
        refs = dict(task.experts)
        shape = tuple(self.cfg.layout.bank(layer).parts[EXPERT_PARTS.index(part)].shape)
        try:
            trained, cb, signs = train_layer(lambda e: self.ck.read(refs[e][part]), len(refs),
                                             shape, self.cfg.rvq,
                                             layer_seed(self.cfg.seed, layer, part),
                                             part=part, threads=self.cfg.threads)
        except ValueError as e:
            raise SourceError(f"layer {layer} experts ({part}): {e}") from e
        if trained != codec:
            raise ConvertError(f"layer {layer} {part}: trained codec {trained} differs from the "
                               f"planned {codec}")
        cb_codec = self._spec(cb_name).codec
        cb_data = encode(cb_codec, np.asarray(cb, np.float32))
        # experts are encoded against the codebook as stored (f16: rounded), so codes and scales
        # fit what decoders use
        cb = decode(cb_codec, cb.shape, cb_data)
        if not np.isfinite(cb).all():
            raise ConvertError(f"layer {layer} {part}: codebook not finite in {cb_codec['name']}")
        self._done(tensor_unit(cb_name), self.writer.write_tensor(cb_name, cb_data), len(cb_data))
        if rot_name is not None:
            data = encode({"name": "f32"}, np.asarray(signs, np.float32))
            self._done(tensor_unit(rot_name), self.writer.write_tensor(rot_name, data), len(data))
        return cb, signs

    def _spec(self, name: str) -> TensorSpec:
        return next(t for t in self.cfg.layout.spec.tensors if t.name == name)

    def _read_back(self, name: str, done: dict[str, str]) -> np.ndarray:
        """A codebook written by an earlier (interrupted) run, checked against the journal."""
        ext = self.cfg.layout.tensor(name)
        data = os.pread(self._sync_fd, ext.length, ext.offset)
        if blake3.blake3(data).hexdigest() != done[tensor_unit(name)]:
            raise ConvertError(f"{self.writer.partial}: {name} differs from the journal; "
                               "rerun with --restart to start this conversion over")
        t = self._spec(name)
        return decode(t.codec, t.shape, data)  # f16 codebooks: the f32 values experts used


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def describe(exc: BaseException) -> str:
    if isinstance(exc, (ConvertError, OSError)):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip() + "\n" + \
        "".join(traceback.format_tb(exc.__traceback__)[-3:])


def process_main(cfg: WorkerConfig, done: dict[str, str], tasks, results) -> None:
    """Entry point of a worker process (spawned): take tasks until a None arrives."""
    _die_with_parent()
    worker = None
    key = "startup"
    try:
        worker = Worker(cfg, results.put)
        while (task := tasks.get()) is not None:
            key = task.key
            worker.run(task, done)
            results.put(("task_done", key, peak_rss()))
    except BaseException as e:  # reported to the coordinator, which stops the run
        results.put(("error", key, describe(e)))
    finally:
        if worker is not None:
            worker.close()


def _die_with_parent() -> None:
    """Linux: get SIGKILLed when the coordinator dies, so no orphan keeps writing."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
