"""`verify_source`: check a Hugging Face checkpoint directory against the hashes it was fetched by.

Sizes are compared first (free); only files of the right size are hashed, largest first, on a
thread pool (hashlib releases the GIL on large updates). Extra files are listed as a warning, not
damage: a stale shard next to the right ones does not change what the converter reads.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moepack.verify.expect import MANIFEST_NAME, Expected, ExpectError, load_expectations

from moepack.sysinfo import usable_cores

Progress = Callable[[int, int], None]
_READ = 8 << 20
# Files whose presence matters to a conversion: weights and configs (tokenizer files included).
_WATCHED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack",
                     ".json", ".model", ".tiktoken")


@dataclass(frozen=True)
class SourceProblem:
    """kind: missing, truncated (smaller), oversized (larger), mismatched (hash), unreadable."""

    kind: str
    name: str
    expected_size: int | None = None
    actual_size: int | None = None
    detail: str = ""


@dataclass
class SourceReport:
    dir: str
    expect: str
    files_checked: int = 0
    bytes_checked: int = 0
    seconds: float = 0.0
    problems: list[SourceProblem] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    size_only: list[str] = field(default_factory=list)  # listed without any hash
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems

    @property
    def exit_code(self) -> int:
        return 2 if self.error is not None else (1 if self.problems else 0)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "exit_code": self.exit_code}


def _hash_file(path: Path, exp: Expected, size: int, tick: Callable[[int], None]) -> str:
    h = hashlib.sha256() if exp.algo == "sha256" else hashlib.sha1(b"blob %d\x00" % size)
    buf = bytearray(_READ)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            tick(n)
    return h.hexdigest()


def _extra_files(root: Path, listed: set[str]) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # .cache, .git
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel not in listed and rel != MANIFEST_NAME and name.endswith(_WATCHED_SUFFIXES):
                out.append(rel)
    return sorted(out)


def _check_one(root: Path, exp: Expected, tick: Callable[[int], None]) -> SourceProblem | None:
    path = root / exp.name
    try:
        size = path.stat().st_size
        if not path.is_file():
            return SourceProblem("unreadable", exp.name, exp.size, None, "not a regular file")
    except FileNotFoundError:
        return SourceProblem("missing", exp.name, exp.size)
    except OSError as e:
        return SourceProblem("unreadable", exp.name, exp.size, None, e.strerror or str(e))
    if exp.size is not None and size != exp.size:
        kind = "truncated" if size < exp.size else "oversized"
        return SourceProblem(kind, exp.name, exp.size, size)
    if exp.algo is None:
        return None
    try:
        got = _hash_file(path, exp, size, tick)
    except OSError as e:
        return SourceProblem("unreadable", exp.name, exp.size, size, e.strerror or str(e))
    if got != exp.digest:
        return SourceProblem("mismatched", exp.name, exp.size, size,
                             f"{exp.algo} {got}, expected {exp.digest}")
    return None


def verify_source(dir: str | Path, expect: str | Path | None = None, *, threads: int | None = None,
                  progress: Progress | None = None) -> SourceReport:
    """Check `dir` against `expect` (default: `dir/moepack-source.json`); see SourceReport."""
    root = Path(dir)
    expect_path = Path(expect) if expect is not None else root / MANIFEST_NAME
    report = SourceReport(str(root), str(expect_path))
    t0 = time.perf_counter()
    if not root.is_dir():
        report.error = f"{root} is not a directory"
        return report
    try:
        files = load_expectations(expect_path)
    except ExpectError as e:
        hint = "" if expect is not None else " (written by `moepack fetch`; or pass --expect FILE)"
        report.error = f"{e}{hint}"
        return report
    total = sum(e.size or 0 for e in files if e.algo)
    done = 0
    lock = threading.Lock()

    def tick(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            if progress is not None:
                progress(done, total)

    order = sorted(files, key=lambda e: -(e.size or 0))  # big files first: best pool packing
    workers = max(1, threads or usable_cores())
    with ThreadPoolExecutor(workers, thread_name_prefix="moepack-sha") as pool:
        found = list(pool.map(lambda e: _check_one(root, e, tick), order))
    by_name = {p.name: p for p in found if p is not None}
    report.problems = [by_name[e.name] for e in files if e.name in by_name]
    report.files_checked = len(files)
    report.bytes_checked = done
    report.size_only = [e.name for e in files if e.algo is None]
    report.extra = _extra_files(root, {e.name for e in files})
    report.seconds = time.perf_counter() - t0
    return report
