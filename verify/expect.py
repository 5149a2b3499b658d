"""What a source checkpoint directory should contain: file names, sizes and hashes.

Two schemas are read:
- the fetch manifest `moepack-source.json`:
  `{"repo", "revision", "files": [{"name", "size", "sha256"}]}`;
- the hub's listings: a JSON list of `{"path" or "rfilename", "size", "lfs": {"sha256" or "oid"}}`
  (the tree API and the model-info `siblings`; also accepted wrapped as `{"siblings": [...]}`).
  Entries without `lfs` are plain git files: their `oid`/`blobId` is the git blob SHA-1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from moepack.safefs import read_bounded
from moepack.untrusted_json import loads

MANIFEST_NAME = "moepack-source.json"
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_SHA1 = re.compile(r"[0-9a-fA-F]{40}")
MAX_EXPECT_BYTES = 64 << 20  # a listing of a few thousand files is far below this
EXPECT_JSON_DEPTH = 16       # {"files": [{"name", ...}]} and hub listings are 3 deep


class ExpectError(ValueError):
    """The expectation file is missing, not JSON, or has the wrong shape."""


@dataclass(frozen=True)
class Expected:
    """One file: `algo` is "sha256", "git-sha1" (git blob hash) or None (size only)."""

    name: str
    size: int | None
    algo: str | None
    digest: str | None


def _safe_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise ExpectError(f"{where}: file name must be a non-empty string")
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or "\\" in name or "\x00" in name:
        raise ExpectError(f"{where}: unsafe file name {name!r}")
    return str(p)


def _size(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ExpectError(f"{where}: size must be a non-negative integer")
    return value


def _from_manifest(entry: Any, where: str) -> Expected:
    if not isinstance(entry, dict):
        raise ExpectError(f"{where}: expected an object")
    sha = entry.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ExpectError(f"{where}.sha256: want 64 hex characters")
    return Expected(_safe_name(entry.get("name"), f"{where}.name"),
                    _size(entry.get("size"), f"{where}.size"), "sha256", sha.lower())


def _from_hub(entry: Any, where: str) -> Expected | None:
    if not isinstance(entry, dict):
        raise ExpectError(f"{where}: expected an object")
    if entry.get("type") == "directory":
        return None
    name = _safe_name(entry.get("path", entry.get("rfilename")), f"{where}.path")
    size = _size(entry.get("size"), f"{where}.size")
    lfs = entry.get("lfs")
    if isinstance(lfs, dict):
        sha = lfs.get("sha256", lfs.get("oid"))
        if isinstance(sha, str) and sha.startswith("sha256:"):
            sha = sha[len("sha256:"):]
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise ExpectError(f"{where}.lfs: want a 64-hex sha256 (or oid)")
        return Expected(name, _size(lfs.get("size", size), f"{where}.lfs.size"), "sha256",
                        sha.lower())
    oid = entry.get("oid", entry.get("blobId"))
    if isinstance(oid, str) and _SHA1.fullmatch(oid):
        return Expected(name, size, "git-sha1", oid.lower())
    return Expected(name, size, None, None)


def parse_expectations(doc: Any) -> list[Expected]:
    """Either schema -> the expected files (duplicate names rejected)."""
    if isinstance(doc, dict) and isinstance(doc.get("files"), list):
        out = [_from_manifest(e, f"files[{i}]") for i, e in enumerate(doc["files"])]
    else:
        if isinstance(doc, dict) and isinstance(doc.get("siblings"), list):
            doc = doc["siblings"]
        if not isinstance(doc, list):
            raise ExpectError(
                "want {'files': [...]} (fetch manifest) or a list of hub file entries")
        out = [e for i, x in enumerate(doc) if (e := _from_hub(x, f"[{i}]")) is not None]
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise ExpectError("a file name is listed twice")
    return out


def load_expectations(path: str | Path) -> list[Expected]:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = read_bounded(f, MAX_EXPECT_BYTES)
    except OSError as e:
        raise ExpectError(f"cannot read {path}: {e.strerror or e}") from None
    # bounded: a downloaded folder's moepack-source.json is as untrusted as the hub
    doc = loads(data, str(path), max_bytes=MAX_EXPECT_BYTES, max_depth=EXPECT_JSON_DEPTH,
                error=ExpectError)
    try:
        return parse_expectations(doc)
    except ExpectError as e:
        raise ExpectError(f"{path}: {e}") from None
