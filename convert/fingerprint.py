"""Source fingerprint: size and SHA-256 of every weight file (FORMAT.md §6 `source.files`).

Hashing hundreds of GB takes minutes, so known hashes are reused: from `moepack-source.json`
(written by `moepack fetch`) when the file is no newer than that manifest and its size matches,
and from a previous run's journal when size and mtime match exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

FETCH_MANIFEST = "moepack-source.json"
CHUNK = 16 << 20


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return h.hexdigest()


def _fetch_hashes(directory: Path) -> dict[str, tuple[int, str]]:
    """name -> (size, sha256) from the fetch manifest, or {} when absent or unreadable."""
    path = directory / FETCH_MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        mtime = path.stat().st_mtime_ns
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
            sha = prev[2]
        elif name in fetched and fetched[name][0] == size:
            sha = fetched[name][1]
        else:
            sha = sha256_file(path, on_bytes)
        out.append({"name": name, "size": size, "sha256": sha, "mtime_ns": mtime})
    return out


def manifest_files(fp: list[dict]) -> list[dict]:
    """The manifest form: mtimes are local facts, not part of the container's bytes."""
    return [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in fp]


def total_bytes(directory: Path, files: list[str]) -> int:
    return sum(os.path.getsize(directory / f) for f in files)
