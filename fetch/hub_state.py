"""Which files of a hub download are already verified, so reruns do not rehash them.

DEST/.moepack-partial/hub-verified.json maps name -> [size, mtime_ns, sha256]; an entry counts
only while the file's size and mtime are unchanged. Written after each file (atomically, through
a new inode: a link planted at the file or its .tmp is replaced, never written through), so an
interrupted 1 TB fetch keeps what it has checked.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from moepack.fetch.hub_listing import JSON_DEPTH
from moepack.fetch.staging import STAGING_DIR

from moepack.safefs import UnsafePathError, ensure_dir, open_existing, write_file
from moepack.untrusted_json import loads

MAX_STATE_BYTES = 64 << 20   # ~100 bytes per file: far above any repository's


def _read_entries(path: Path) -> dict[str, list]:
    """The recorded entries; a missing, linked, oversized or malformed file counts as empty
    (it only saves rehashing)."""
    try:
        with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
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

    def sha256(self, name: str) -> str | None:
        """The recorded SHA-256 if the file is unchanged since it was verified."""
        entry = self._entries.get(name)
        try:
            st = (self.dest / name).stat()
        except OSError:
            return None
        if (entry and len(entry) == 3 and entry[0] == st.st_size and entry[1] == st.st_mtime_ns
                and isinstance(entry[2], str)):
            return entry[2]
        return None

    def add(self, name: str, sha256: str) -> None:
        st = (self.dest / name).stat()
        with self._lock:
            self._entries[name] = [st.st_size, st.st_mtime_ns, sha256]
            ensure_dir(self.path.parent)
            tmp = self.path.with_suffix(".tmp")
            write_file(tmp, json.dumps(self._entries, sort_keys=True).encode("utf-8"))
            os.replace(tmp, self.path)
