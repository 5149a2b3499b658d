"""The one place that turns untrusted names into output paths and creates files safely.

Names that come from a container index, a hub listing or torrent metadata must be a single plain
file name (`plain_name`). Files and folders the tools create are opened without following
symbolic links (`open_new`, `open_existing`, `ensure_dir`): a link planted where a tool writes
would otherwise redirect the write to any file the user can write. Text from untrusted input is
shown through `printable` so that terminal escape sequences never reach the terminal.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path
from typing import BinaryIO

from moepack.durable import naming

MAX_NAME_BYTES = 255   # NAME_MAX on Linux and macOS
_CONTROL = ("Cc", "Cf", "Cs", "Zl", "Zp")   # control, format, surrogate, line/paragraph breaks


class UnsafePathError(ValueError):
    """A name or path that would write outside the destination or through a link."""


def name_problem(name: object) -> str | None:
    """Why `name` is not a single plain file name, or None when it is one."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if name in ("", ".", ".."):
        return "is empty, '.' or '..'"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if any(unicodedata.category(ch) in _CONTROL for ch in name):
        return "contains a control or format character"
    try:
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            return f"is longer than {MAX_NAME_BYTES} bytes"
    except UnicodeEncodeError:
        return "is not valid Unicode"
    return None


def plain_name(name: object, what: str) -> str:
    """`name` if it is a single plain file name, else UnsafePathError naming `what`."""
    problem = name_problem(name)
    if problem:
        raise UnsafePathError(f"{what} {printable(str(name))!s} {problem}; "
                              "only a plain file name is allowed")
    return name  # type: ignore[return-value]


def child(folder: str | os.PathLike, name: object, what: str) -> Path:
    """folder/name for an untrusted `name` (checked by plain_name)."""
    return Path(folder) / plain_name(name, what)


def one_line(text: str) -> str:
    """`text` with control, format and surrogate characters escaped (newlines included), so a
    message is one line and cannot drive the terminal."""
    return "".join(ch.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(ch) in _CONTROL else ch for ch in text)


def printable(text: str, limit: int = 200) -> str:
    """`text` in single quotes, escaped as `one_line` does (and its quotes and backslashes),
    cut at `limit` characters: safe to print to a terminal."""
    inner = one_line(text[:limit].replace("\\", "\\\\").replace("'", "\\'"))
    return "'" + inner + ("..." if len(text) > limit else "") + "'"


def refuse_link(path: Path) -> None:
    """UnsafePathError when `path` is a symbolic link (a missing path is fine)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symbolic link; refusing to write through it")


def ensure_dir(path: str | os.PathLike, mode: int = 0o755) -> Path:
    """Create folder `path` (one level) or accept an existing real folder; a symbolic link or a
    non-folder there is refused."""
    p = Path(path)
    try:
        os.mkdir(p, mode)
    except FileExistsError:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(f"{p} is a symbolic link; refusing to write through it") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{p} exists and is not a folder") from None
    return p


def open_new(path: str | os.PathLike, flags: int = os.O_WRONLY, mode: int = 0o644,
             *, replace: bool = False) -> int:
    """A file descriptor for a file the caller creates. `replace=True` first removes an existing
    regular file or link at `path` (the link itself, never its target); without it an existing
    entry is FileExistsError. Never follows a link."""
    p = Path(path)
    if replace:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{p} is a folder")
            os.unlink(p)
    return os.open(p, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def open_existing(path: str | os.PathLike, flags: int = os.O_RDWR) -> int:
    """Open an existing regular file without following a link at its last component; a link is
    UnsafePathError, a FIFO, device or folder is refused before it can block."""
    p = Path(path)
    try:
        fd = os.open(p, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == getattr(os, "ELOOP", 40) or _is_link(p):
            raise UnsafePathError(f"{p} is a symbolic link; refusing to write through it") from e
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(f"{p} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _is_link(p: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(p).st_mode)
    except OSError:
        return False


def write_file(path: str | os.PathLike, data: bytes, *, replace: bool = True) -> None:
    """Write `data` to `path` through a new inode (never through a planted link). A write that
    fails (a full disk, RLIMIT_FSIZE) removes the file it made, so no half-written file is left
    under a name a later run may trust, and the OSError names `path`."""
    fd = open_new(path, os.O_WRONLY, replace=replace)
    made = os.fstat(fd)
    try:
        with naming(path), os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        try:  # only the inode made here, not whatever took the name meanwhile
            if os.path.samestat(os.lstat(path), made):
                os.unlink(path)
        except OSError:
            pass
        raise


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """`path` if it is a regular file (following links the user gave), else UnsafePathError;
    a FIFO or device would block a reader forever."""
    p = Path(path)
    st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UnsafePathError(f"{what} {p} is {kind}")
    return p


def remove_created(folder: str | os.PathLike, names: list[str]) -> bool:
    """Remove the regular files `names` that the caller created in `folder` (this user's real
    folder), then the folder if that emptied it. Links, sub-folders, unlisted entries and a
    folder that is a link or another user's stay. True when the folder is gone."""
    p = Path(folder)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    for name in names:
        if name_problem(name) is not None:
            continue
        try:
            if stat.S_ISREG(os.lstat(p / name).st_mode):
                os.unlink(p / name)
        except FileNotFoundError:
            continue
    try:
        os.rmdir(p)
    except OSError:
        return False
    return True


def file_kind(mode: int) -> str:
    """What a non-regular directory entry is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a file"


def read_bounded(f: BinaryIO, limit: int, chunk: int = 1 << 20) -> bytes:
    """At most `limit + 1` bytes of `f` (one more than allowed tells the caller a file is too
    big), memory taken as bytes arrive: `f.read(limit + 1)` reserves all `limit + 1` bytes up
    front, 1 GiB to read a 2 KB tokenizer.json against a 1 GiB limit (a MemoryError under
    ulimit -v, a commit charge under strict overcommit)."""
    out = bytearray()
    while len(out) <= limit:
        data = f.read(min(chunk, limit + 1 - len(out)))
        if not data:
            break
        out += data
    return bytes(out)
