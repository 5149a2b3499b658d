"""Where a torrent download lives until it verifies, and how it gets to its final name.

DEST/.moepack-partial/<info-hash>/<name> holds the file while libtorrent writes it, next to
`resume.dat`. Only a fully verified container is renamed to DEST/<name> (same filesystem, so
the rename is atomic); a failed or malformed fetch never truncates or replaces a good file.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from moepack.fetch.errors import FetchError

from moepack.durable import fsync_path

STAGING_DIR = ".moepack-partial"


@dataclass(frozen=True)
class Staging:
    dest: Path
    name: str
    key: str     # info-hash hex

    @property
    def final(self) -> Path:
        return self.dest / self.name

    @property
    def dir(self) -> Path:
        return self.dest / STAGING_DIR / self.key

    @property
    def file(self) -> Path:
        return self.dir / self.name

    @property
    def resume_file(self) -> Path:
        return self.dir / "resume.dat"

    def prepare(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FetchError(f"cannot create {self.dir}: {e.strerror or e}") from e

    def read_resume(self) -> bytes | None:
        try:
            return self.resume_file.read_bytes()
        except FileNotFoundError:
            return None

    def write_resume(self, data: bytes) -> None:
        tmp = self.resume_file.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.resume_file)

    def drop_resume(self) -> None:
        self.resume_file.unlink(missing_ok=True)

    def adopt_final(self) -> bool:
        """Move an existing damaged DEST/<name> into staging so only bad pieces are fetched."""
        if self.file.exists() or not self.final.exists():
            return False
        os.replace(self.final, self.file)
        self.drop_resume()   # the file changed under any saved state: recheck it
        return True

    def give_back(self) -> None:
        """Undo adopt_final after a failure (the file only gained hash-checked pieces)."""
        if self.file.exists() and not self.final.exists():
            os.replace(self.file, self.final)
            self.drop_resume()

    def publish(self) -> Path:
        os.replace(self.file, self.final)
        fsync_path(self.dest)
        self.drop_resume()
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            self.dir.parent.rmdir()   # only if no other download is staged
        except OSError:
            pass
        return self.final
