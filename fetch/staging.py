"""Where a torrent download lives until it verifies, and how it gets to its final name.

DEST/.moepack-partial/<info-hash>/<name> holds the file while libtorrent writes it, next to
`resume.dat`. Only a fully verified container is renamed to DEST/<name> (same filesystem, so
the rename is atomic); a failed or malformed fetch never truncates or replaces a good file.

libtorrent opens the staged file itself (following links), so `prepare` checks with lstat that
neither staging folder nor the staged file is a symbolic link before the path is handed over;
resume data goes through a new inode (safefs), never through a planted link.

Another torrent of the same container (other piece size, v1 or v2 only) stages under another
info-hash: `others` finds those copies, `reuse` moves one here (libtorrent rechecks it and keeps
every piece that passes), and `remove_other` deletes a superseded folder. Only real folders
named by an info-hash directly in DEST/.moepack-partial are touched, never through a link.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moepack.fetch.errors import FetchError

from moepack.durable import fsync_path
from moepack.safefs import (
    UnsafePathError,
    ensure_dir,
    open_existing,
    read_bounded,
    refuse_link,
    write_file,
)

STAGING_DIR = ".moepack-partial"
MAX_RESUME_BYTES = 64 << 20   # resume data of a 4 TiB torrent is a few MB
_KEY = re.compile(r"[0-9a-f]{40}")                       # an info-hash folder
_OWN_FILES = ("resume.dat", "resume.tmp", "appended.bin")   # bookkeeping, not a staged copy


@dataclass(frozen=True)
class Staging:
    dest: Path
    name: str    # a plain file name (torrent_source.describe checks it)
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
        """Create the staging folders; refuse links there and at the staged file."""
        try:
            ensure_dir(self.dir.parent)
            ensure_dir(self.dir)
            refuse_link(self.file)
        except UnsafePathError as e:
            raise FetchError(str(e)) from e
        except OSError as e:
            raise FetchError(f"cannot create {self.dir}: {e.strerror or e}") from e

    def read_resume(self) -> bytes | None:
        """Saved resume data, or None (absent, a link, oversized: libtorrent rechecks)."""
        try:
            with os.fdopen(open_existing(self.resume_file, os.O_RDONLY), "rb") as f:
                data = read_bounded(f, MAX_RESUME_BYTES)
        except (OSError, UnsafePathError):
            return None
        return data if len(data) <= MAX_RESUME_BYTES else None

    def write_resume(self, data: bytes) -> None:
        """Atomically replace resume.dat; FetchError (the .tmp removed) when it cannot be saved,
        e.g. on a full disk."""
        tmp = self.resume_file.with_suffix(".tmp")
        try:
            write_file(tmp, data)
            os.replace(tmp, self.resume_file)
        except (OSError, UnsafePathError) as e:
            _remove_file(tmp)
            raise FetchError(f"cannot save resume data in {self.dir}: "
                             f"{getattr(e, 'strerror', None) or e}") from e

    def drop_resume(self) -> None:
        _remove_file(self.resume_file)

    @property
    def tail_file(self) -> Path:
        return self.dir / "appended.bin"

    def adopt_final(self, size: int) -> int | None:
        """Move an existing damaged DEST/<name> into staging so only bad pieces are fetched,
        and bring it to the torrent's `size` there: a truncated copy is extended (sparse; the
        missing pieces are fetched), bytes appended to a copy are set aside in `tail_file`.
        Returns the file's size before (for give_back), None when nothing was adopted.
        The caller has refused a link at DEST/<name>; a link is never moved into staging,
        where libtorrent would write through it."""
        if os.path.lexists(self.file) or not os.path.lexists(self.final):
            return None
        try:
            refuse_link(self.final)
        except UnsafePathError as e:
            raise FetchError(str(e)) from e
        os.replace(self.final, self.file)
        self.drop_resume()   # the file changed under any saved state: recheck it
        had = os.stat(self.file).st_size
        try:
            if had > size:
                with open(self.file, "rb") as f:
                    f.seek(size)
                    write_file(self.tail_file, f.read())   # bounded by the caller
            if had != size:
                os.truncate(self.file, size)
        except (OSError, UnsafePathError) as e:
            self.give_back(had)
            raise FetchError(f"cannot bring {self.final} to the torrent's {size} bytes in "
                             f"{self.dir}: {getattr(e, 'strerror', None) or e}") from e
        return had

    def give_back(self, had: int) -> None:
        """Undo adopt_final after a failure: the file gets its old size back (appended bytes
        restored), so it has only gained hash-checked pieces; any entry that appeared at the
        final name meanwhile is left alone."""
        if not os.path.isfile(self.file) or os.path.lexists(self.final):
            return
        size = os.stat(self.file).st_size
        if had < size:
            os.truncate(self.file, had)
        elif had > size and os.path.isfile(self.tail_file):
            with open(self.file, "ab") as out, open(self.tail_file, "rb") as tail:
                shutil.copyfileobj(tail, out)
        _remove_file(self.tail_file)
        os.replace(self.file, self.final)
        self.drop_resume()

    def others(self) -> list[Path]:
        """Files other torrents staged in this destination, most bytes on disk first."""
        found = [(st.st_blocks, f) for folder, _ in _entries(self.dest / STAGING_DIR, stat.S_ISDIR)
                 if folder.name != self.key and _KEY.fullmatch(folder.name)
                 for f, st in _entries(folder, stat.S_ISREG) if f.name not in _OWN_FILES]
        return [f for _, f in sorted(found, key=lambda x: -x[0])]

    def reuse(self, other: Path) -> None:
        """Move another torrent's staged copy here (no resume data: libtorrent rechecks it) and
        remove the rest of that torrent's staging."""
        os.replace(other, self.file)
        self.drop_resume()
        self.remove_other(other)

    def remove_other(self, other: Path) -> None:
        """Remove the staging folder of `other` (a path from `others`); best effort. rmtree
        unlinks links inside instead of following them, and refuses a folder that is one."""
        folder = other.parent
        if folder.parent == self.dest / STAGING_DIR and _KEY.fullmatch(folder.name):
            shutil.rmtree(folder, ignore_errors=True)

    def publish(self) -> Path:
        """Rename the verified file to its final name: the rename replaces the entry there
        (even a link planted meanwhile) and never writes through it."""
        os.replace(self.file, self.final)
        fsync_path(self.dest)
        self.drop_resume()
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            self.dir.parent.rmdir()   # only if no other download is staged
        except OSError:
            pass
        return self.final


def _entries(folder: Path, kind: Callable[[int], bool]) -> list[tuple[Path, os.stat_result]]:
    """The entries of `folder` whose lstat mode passes `kind` (S_ISDIR, S_ISREG: a link never
    does), with that lstat; none when `folder` is missing or is not a real folder."""
    out = []
    try:
        names = sorted(os.listdir(folder)) if stat.S_ISDIR(os.lstat(folder).st_mode) else []
    except OSError:
        return []
    for name in names:
        try:
            st = os.lstat(folder / name)
        except OSError:   # gone meanwhile
            continue
        if kind(st.st_mode):
            out.append((folder / name, st))
    return out


def _remove_file(path: Path) -> None:
    """Remove `path` (a link itself, not its target) if present; best effort."""
    try:
        os.unlink(path)
    except OSError:
        pass
