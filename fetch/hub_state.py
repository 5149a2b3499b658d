"""Which files of a hub download are already verified, so reruns do not rehash them.

DEST/.moepack-partial/hub-verified.json maps name -> [size, mtime_ns, sha256]; an entry counts
only while the file's size and mtime are unchanged. Written after each file (atomically), so an
interrupted 1 TB fetch keeps what it has checked.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from moepack.fetch.staging import STAGING_DIR


class VerifiedRecord:
    def __init__(self, dest: Path) -> None:
        self.path = dest / STAGING_DIR / "hub-verified.json"
        self.dest = dest
        self._lock = threading.Lock()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._entries = {str(k): list(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            self._entries = {}

    def sha256(self, name: str) -> str | None:
        """The recorded SHA-256 if the file is unchanged since it was verified."""
        entry = self._entries.get(name)
        try:
            st = (self.dest / name).stat()
        except OSError:
            return None
        if entry and len(entry) == 3 and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            return str(entry[2])
        return None

    def add(self, name: str, sha256: str) -> None:
        st = (self.dest / name).stat()
        with self._lock:
            self._entries[name] = [st.st_size, st.st_mtime_ns, sha256]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._entries, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)
