"""Source fingerprint: size and SHA-256 of every weight file (FORMAT.md §6 `source.files`).

Hashing hundreds of GB takes minutes, so known hashes are reused: from `moepack-source.json`
(written by `moepack fetch`) when the file is no newer than that manifest and its size matches,
and from a previous run's journal when size and mtime match exactly.

The same pass refuses non-finite weights (NaN/Inf in any F32/F16/BF16/F8_E4M3 tensor), naming
tensor and file, before the output exists: fused with hashing it costs nothing measurable in a
pass that reads every byte anyway (docs/CONVERT.md, "Non-finite weights"). A file whose hash
fetch recorded is still scanned (without hashing); one a previous run of this conversion
journaled was scanned then.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
from moepack.convert.errors import SourceError
from moepack.convert.st_header import DTYPE_SIZES, read_header

from moepack.safefs import open_existing, read_bounded
from moepack.untrusted_json import loads

FETCH_MANIFEST = "moepack-source.json"
MAX_MANIFEST_BYTES = 64 << 20
CHUNK = 16 << 20
# dtype -> (unsigned view, exponent mask): all exponent bits set is Inf or NaN (e4m3fn: NaN only)
_EXPONENT = {"F32": ("<u4", 0x7F800000), "F16": ("<u2", 0x7C00), "BF16": ("<u2", 0x7F80),
             "F8_E4M3": ("u1", 0x7F)}


def first_nonfinite(data: bytes, dtype: str) -> int | None:
    """Index of the first Inf/NaN element of little-endian `data` of `dtype`, else None."""
    view, mask = _EXPONENT[dtype]
    a = np.frombuffer(data, view)
    bad = np.bitwise_and(a, mask) == mask
    return int(np.argmax(bad)) if bad.any() else None


def _segments(path: Path) -> Iterator[tuple[int, int, str | None, str]]:
    """(start, end, dtype or None, tensor) covering the file in order: header, then tensors
    (read_header validated that they are contiguous up to the end of the file)."""
    table = sorted(read_header(path).items(), key=lambda kv: kv[1].start)
    first = table[0][1].start if table else os.path.getsize(path)
    yield 0, first, None, ""
    for name, t in table:
        yield t.start, t.end, t.dtype, name


def scan_file(path: Path, on_bytes: Callable[[int], None] | None = None,
              hashing: bool = True) -> str | None:
    """One read of `path`: its SHA-256 (when `hashing`), refusing non-finite weights."""
    h = hashlib.sha256() if hashing else None
    with open(path, "rb", buffering=1 << 20) as f:
        for start, end, dtype, name in _segments(path):
            item = DTYPE_SIZES.get(dtype or "", 1)
            pos = start
            while pos < end:
                chunk = f.read(min(CHUNK, end - pos))  # CHUNK is a multiple of every item
                if not chunk:
                    raise SourceError(f"{path.name}: truncated while reading tensor {name!r}")
                if h is not None:
                    h.update(chunk)
                bad = first_nonfinite(chunk, dtype) if dtype in _EXPONENT else None
                if bad is not None:
                    at = (pos - start) // item + bad
                    raise SourceError(f"{path.name}: tensor {name!r} holds non-finite values "
                                      f"(NaN or Inf; first at element {at:,}); the checkpoint "
                                      "is damaged")
                pos += len(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
    return h.hexdigest() if h is not None else None


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    sha = scan_file(path, on_bytes)
    assert sha is not None
    return sha


def _fetch_hashes(directory: Path) -> dict[str, tuple[int, str]]:
    """name -> (size, sha256) from the fetch manifest, or {} when absent or unreadable."""
    path = directory / FETCH_MANIFEST
    try:  # untrusted: bounded JSON; a link, FIFO or device there is ignored, never waited on
        with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime_ns
            data = loads(read_bounded(f, MAX_MANIFEST_BYTES), FETCH_MANIFEST,
                         max_bytes=MAX_MANIFEST_BYTES, max_depth=16)
        out = {}
        for f in data["files"]:
            fp = directory / f["name"]
            # A file changed after fetch wrote its hash cannot reuse it.
            if fp.stat().st_mtime_ns <= mtime:
                out[str(f["name"])] = (int(f["size"]), str(f["sha256"]))
        return out
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def stat_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def fingerprint(directory: Path, files: list[str],
                known: Mapping[str, tuple[int, int, str]] | None = None,
                on_bytes: Callable[[int], None] | None = None) -> list[dict]:
    """`[{name, size, sha256, mtime_ns}]` sorted by name; `known`: name -> (size, mtime_ns, sha)."""
    fetched = _fetch_hashes(directory)
    out = []
    for name in sorted(files):
        path = directory / name
        size, mtime = stat_key(path)
        prev = (known or {}).get(name)
        if prev and prev[0] == size and prev[1] == mtime:
            sha = prev[2]  # scanned by the run that journaled it
        elif name in fetched and fetched[name][0] == size:
            sha = fetched[name][1]
            scan_file(path, on_bytes, hashing=False)
        else:
            sha = sha256_file(path, on_bytes)
        out.append({"name": name, "size": size, "sha256": sha, "mtime_ns": mtime})
    return out


def manifest_files(fp: list[dict]) -> list[dict]:
    """The manifest form: mtimes are local facts, not part of the container's bytes."""
    return [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in fp]


def total_bytes(directory: Path, files: list[str]) -> int:
    return sum(os.path.getsize(directory / f) for f in files)
