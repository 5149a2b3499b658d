"""Which files of a hub download are already verified, so reruns do not rehash them.

DEST/.moepack-partial/hub-verified.json maps name -> [size, mtime_ns, sha256, git blob SHA-1];
an entry counts only while the file's size and mtime are unchanged, and only for the listing's
content: the LFS SHA-256, or for a plain file (which the hub gives no SHA-256) the blob hash.
Written after each file (atomically, through a new inode: a link planted at the file or its
.tmp is replaced, never written through), so an interrupted 1 TB fetch keeps what it has
checked.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from moepack.fetch.hub_listing import JSON_DEPTH, RemoteFile
from moepack.fetch.staging import STAGING_DIR

from moepack.safefs import (
    UnsafePathError,
    ensure_dir,
    open_existing,
    read_bounded,
    write_file,
)
from moepack.untrusted_json import loads

MAX_STATE_BYTES = 64 << 20   # ~100 bytes per file: far above any repository's


def _read_entries(path: Path) -> dict[str, list]:
    """The recorded entries; a missing, linked, oversized or malformed file counts as empty
    (it only saves rehashing)."""
    try:
        with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:
            data = read_bounded(f, MAX_STATE_BYTES)
        doc = loads(data, str(path), max_bytes=MAX_STATE_BYTES, max_depth=JSON_DEPTH)
    except (OSError, UnsafePathError, ValueError):   # ValueError: bad JSON
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): v for k, v in doc.items() if isinstance(v, list)}


class VerifiedRecord:
    def __init__(self, dest: Path) -> None:
        self.path = dest / STAGING_DIR / "hub-verified.json"
        self.dest = dest
        self._lock = threading.Lock()
        self._entries = _read_entries(self.path)

    def _unchanged(self, name: str) -> list | None:
        """The entry if the file's size and mtime are still those recorded."""
        entry = self._entries.get(name)
        try:
            st = (self.dest / name).stat()
        except OSError:
            return None
        if (entry and len(entry) in (3, 4) and entry[0] == st.st_size
                and entry[1] == st.st_mtime_ns and isinstance(entry[2], str)):
            return entry
        return None

    def verified(self, f: RemoteFile) -> str | None:
        """The recorded SHA-256 if the file is unchanged and was verified as the listed content
        (a plain file of the same size at another revision is not)."""
        entry = self._unchanged(f.name)
        if entry is None:
            return None
        if f.sha256 is not None:
            return entry[2] if entry[2] == f.sha256 else None
        return entry[2] if entry[3:] == [f.blob_id] else None

    def checked(self, f: RemoteFile, sha256: str) -> None:
        """Record `f` as content_problem found it: the hash that was compared with the hub's."""
        self.add(f.name, sha256, f.blob_id if f.sha256 is None else None)

    def add(self, name: str, sha256: str, blob_id: str | None = None) -> None:
        """Record `name` as verified; `blob_id` once its git blob hash was checked too."""
        st = (self.dest / name).stat()
        with self._lock:
            entry = [st.st_size, st.st_mtime_ns, sha256]
            self._entries[name] = [*entry, blob_id] if blob_id else entry
            ensure_dir(self.path.parent)
            tmp = self.path.with_suffix(".tmp")
            write_file(tmp, json.dumps(self._entries, sort_keys=True).encode("utf-8"))
            os.replace(tmp, self.path)
