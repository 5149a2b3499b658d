"""The conversion journal `OUT.moepack.journal`: append-only JSON lines, fsynced.

Line 1 is the header: the fingerprint of what is being made (source files, settings, converter,
planned layout). Every later line records one finished unit and its BLAKE3 digest:
`{"u": "tensor:layers.0.attn.q", "h": "<hex>"}`. A unit is journaled only after its bytes are
durable in the `.partial` file, so after a SIGKILL or power loss every journaled unit is on disk;
a torn last line (killed mid-append) is dropped. A record with `"h": null` takes a unit back (its
bytes, or what they were derived from, are to be redone); a later record of it wins again.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from moepack.convert.errors import ConvertError

from moepack.durable import naming, try_flock
from moepack.safefs import UnsafePathError, open_existing
from moepack.untrusted_json import loads

FORMAT = "moepack-convert-journal/1"
MAX_RECORD_BYTES = 64 << 20   # one journal line (the header, with the source fingerprint)
_OPEN_TRIES = 5


def journal_path(out: Path) -> Path:
    return out.with_name(out.name + ".journal")


def differences(old: object, new: object, where: str = "") -> list[str]:
    """Human-readable paths where two JSON values differ (first few only)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += differences(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out += differences(a, b, f"{where}[{i}]")
        return out
    return [] if old == new else [f"{where}: was {_short(old)}, now {_short(new)}"]


def _short(v: object) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 80 else s[:77] + "..."


class Journal:
    """Open with `Journal.open(path, header)`; holds an exclusive lock while open."""

    def __init__(self, path: Path, fd: int, header: dict, done: dict[str, str]) -> None:
        self.path, self._fd, self.header, self.done = path, fd, header, done

    @staticmethod
    def read_header(path: Path) -> dict | None:
        """The header of a journal at `path`; None when there is none (a link or a FIFO planted
        there is not one: it is neither followed nor read)."""
        try:
            with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:
                first = f.readline(MAX_RECORD_BYTES + 1)
            head = loads(first, str(path), max_bytes=MAX_RECORD_BYTES)
            return head if isinstance(head, dict) and head.get("format") == FORMAT else None
        except (OSError, ValueError, UnsafePathError):
            return None

    @classmethod
    def create(cls, path: Path, header: dict) -> Journal:
        for _ in range(_OPEN_TRIES):
            fd = cls._open_or_create(path)
            cls._lock(fd, path)  # before truncating: never clobber a running conversion's journal
            if _still_named(fd, path):
                break
            os.close(fd)  # a run that just finished removed it: lock the one at the name now
        else:
            raise ConvertError(f"{path} keeps being replaced while opening it (another "
                               "conversion of this output starting and stopping?); rerun")
        j = cls(path, fd, {**header, "format": FORMAT}, {})
        try:
            with naming(path):
                os.ftruncate(fd, 0)
            j._append([j.header])
        except BaseException:  # e.g. no room for the header: truncated, so nothing to keep
            j.remove()
            raise
        return j

    @staticmethod
    def _open_or_create(path: Path) -> int:
        """Open or create the journal without following a link. Not O_EXCL: a running
        conversion's journal must be opened (not replaced) so that its lock is seen."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if os.path.islink(path):
                raise UnsafePathError(f"{path} is a symbolic link; refusing to write through "
                                      "it") from e
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafePathError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return fd

    @classmethod
    def resume(cls, path: Path) -> Journal:
        fd = open_existing(path, os.O_RDWR)
        cls._lock(fd, path)
        if not _still_named(fd, path):  # removed or replaced before the lock was ours
            os.close(fd)
            raise ConvertError(f"{path} was removed or replaced by another conversion of this "
                               "output while opening it; rerun the same command")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
        good_end, header, done = _parse(raw, path)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            os.close(fd)
            raise ConvertError(f"{path}: not a moepack conversion journal")
        try:
            with naming(path):
                os.ftruncate(fd, good_end)  # drop a torn tail before appending
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, header, done)

    @staticmethod
    def read_done(path: Path) -> dict[str, str]:
        """The units a journal records as done, read without locking or changing it (what a
        resume would start from, before checking the partial's bytes); {} when unreadable."""
        try:
            with os.fdopen(open_existing(path, os.O_RDONLY), "rb") as f:
                _, header, done = _parse(f.read(), path)
        except (OSError, UnsafePathError):
            return {}
        ok = isinstance(header, dict) and header.get("format") == FORMAT
        return done if ok else {}

    @staticmethod
    def _lock(fd: int, path: Path) -> None:
        holder = try_flock(fd)
        if holder is not None:
            os.close(fd)
            raise ConvertError(busy_message(path, holder))

    @staticmethod
    def refuse_if_running(path: Path) -> None:
        """ConvertError naming the running conversion when one holds the journal at `path`;
        nothing is changed (so a second run says that, not that the partial differs)."""
        try:
            fd = open_existing(path, os.O_RDONLY)
        except (OSError, UnsafePathError):
            return
        try:
            holder = try_flock(fd)
        finally:
            os.close(fd)
        if holder is not None:
            raise ConvertError(busy_message(path, holder))

    def _append(self, records: Iterable[dict]) -> None:
        data = b"".join(json.dumps(r, sort_keys=True, separators=(",", ":")).encode() + b"\n"
                        for r in records)
        with naming(self.path):  # a full disk, RLIMIT_FSIZE: the error line says which file
            os.lseek(self._fd, 0, os.SEEK_END)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)

    def record(self, units: Iterable[tuple[str, str]]) -> None:
        """Journal finished units (their bytes must already be durable)."""
        units = list(units)
        self._append({"u": u, "h": h} for u, h in units)
        self.done.update(units)

    def forget(self, units: Iterable[str]) -> None:
        """Treat units as not done (their bytes are damaged, or derived from damaged ones);
        journaled, so a rerun after an interruption redoes them too. Recording them again wins."""
        units = [u for u in units if u in self.done]
        if units:
            self._append({"u": u, "h": None} for u in units)
        for u in units:
            del self.done[u]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        """Unlink while still locked, then close: a run that opened the journal meanwhile
        finds, once it has the lock, that it is no longer the one at the name (_still_named)."""
        if self._fd >= 0 and _still_named(self._fd, self.path):
            self.path.unlink(missing_ok=True)
        self.close()


def busy_message(path: Path, holder: str) -> str:
    return (f"{path}: another conversion of this output is running ({holder} holds this "
            "journal's lock); wait for it to finish, or stop it and rerun the same command to "
            "continue its work")


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open at `fd` (not removed or replaced since)."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


def _parse(raw: bytes, path: Path) -> tuple[int, dict | None, dict[str, str]]:
    """(end of the good part, header, unit -> digest) of a journal's bytes."""
    good_end, header, done = 0, None, {}
    pos = 0
    for line in raw.split(b"\n")[:-1]:  # the part after the last newline is torn or empty
        pos += len(line) + 1
        try:  # bounded; a torn or foreign record ends the good part
            rec = loads(line, str(path), max_bytes=MAX_RECORD_BYTES)
            if header is None:
                header = rec
            elif rec["h"] is None:
                done.pop(rec["u"], None)
            else:
                done[rec["u"]] = rec["h"]
        except (ValueError, KeyError, TypeError):
            break
        good_end = pos
    return good_end, header if isinstance(header, dict) else None, done
