"""`moepack-source.json`: what `convert` and `verify --source` read about a fetched checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

from moepack.safefs import write_file

MANIFEST_NAME = "moepack-source.json"


def write_manifest(dest: Path, repo: str, revision: str,
                   files: list[tuple[str, int, str]]) -> Path:
    """files: (name, size, sha256). Written last and atomically: its mtime vouches for the files.
    The .tmp is a new inode (a link planted there is removed, not followed); the rename replaces
    whatever entry is at the final name, never writing through it."""
    doc = {"repo": repo, "revision": revision,
           "files": [{"name": n, "size": s, "sha256": h} for n, s, h in sorted(files)]}
    path = dest / MANIFEST_NAME
    tmp = path.with_name(path.name + ".tmp")
    write_file(tmp, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    os.replace(tmp, path)
    return path
