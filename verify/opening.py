"""Open a container for verification, tolerating a damaged header or index.

`Container.open` rejects a file at its first problem; verification must instead tell *which*
part is damaged and still check the rest when it can. The rules (docs/VERIFY.md):
- Not interpretable at all (too short, all-zero header, wrong magic, unknown major, a header
  whose hash is right but whose fields are invalid or disagree with the file size, an index
  authenticated by the root hash yet invalid) -> `Unverifiable` (exit 2).
- Header hash wrong but its fields still describe the file -> damage `header`; the index is
  then authenticated by the root hash stored in that header, or used unauthenticated (noted).
- Header intact but the index's BLAKE3 differs from the root hash -> damage `index`; the index
  cannot be trusted, so no item is checked against it.
Parsing reuses moepack.format's checks (parse_header, parse_index); only the order of checks
differs from the reader.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
from moepack.format.errors import FormatError
from moepack.format.header import Header, parse_header
from moepack.format.limits import HEADER_SIZE
from moepack.format.reader import parse_index
from moepack.verify.report import Damage

_HASHED = 96  # the header hash covers bytes 0..95 (FORMAT.md section 2)


class Unverifiable(Exception):
    """The file cannot be interpreted as a container; the message says why, `code` is the
    stable code of the rule it breaks (moepack.format.errors.CODES) where one applies."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Opened:
    header: Header | None  # None: the header is damaged beyond use
    sections: list[dict[str, Any]] | None  # None: the index cannot be used to check items
    damage: list[Damage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    container_id: str | None = None  # None when neither header nor index can vouch for it


def _read_exact(fd: int, n: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _header(head: bytes, size: int) -> tuple[Header, list[Damage]]:
    try:
        return parse_header(head, size), []
    except FormatError as e:
        first = str(e)
        if e.code != "header_hash_mismatch":
            if e.code == "file_size_mismatch" and size < _declared_size(head):
                first = f"truncated: {first}"
            raise Unverifiable(first, e.code) from None
    # Re-seal the header so the reader's own field checks run on the damaged bytes.
    resealed = head[:_HASHED] + blake3.blake3(head[:_HASHED]).digest()
    try:
        h = parse_header(resealed, size)
    except FormatError as e:
        raise _HeaderUnusable(f"{first}; its fields are unusable too ({e})") from None
    return h, [Damage("header", "header", 0, HEADER_SIZE, first, "header_hash_mismatch")]


def header_claim(path: str | Path) -> str | None:
    """The root hash (container ID) an intact header names, checked against the size the
    header declares rather than the file's: None unless the header's own hash matches."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO must not block the open
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = _read_exact(fd, HEADER_SIZE, 0)
        return parse_header(head, _declared_size(head)).root_hash.hex()
    except (OSError, FormatError):
        return None
    finally:
        os.close(fd)


def _declared_size(head: bytes) -> int:
    # file_size is the u64 at offset 24 (FORMAT.md section 2); only used to word the message.
    return int.from_bytes(head[24:32], "little")


class _HeaderUnusable(Exception):
    pass


def open_for_verify(path: str | Path) -> Opened:
    """What could be opened, and the damage found on the way; raises Unverifiable."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise Unverifiable(f"cannot open: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Unverifiable("not a regular file", "not_regular_file")
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise Unverifiable(f"cannot open: {e.strerror or e}") from None
    try:
        head = _read_exact(fd, HEADER_SIZE, 0)
        try:
            h, damage = _header(head, st.st_size)
        except _HeaderUnusable as e:
            return Opened(None, None, [Damage("header", "header", 0, HEADER_SIZE, str(e),
                                              "header_hash_mismatch")],
                          ["items not checked: the damaged header does not locate the index"])
        index = _read_exact(fd, h.index_length, h.index_offset)
    except OSError as e:
        raise Unverifiable(f"cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return _open_index(h, index, damage)


def _open_index(h: Header, index: bytes, damage: list[Damage]) -> Opened:
    root_ok = blake3.blake3(index).digest() == h.root_hash
    # The ID is trusted from an intact header, or from a damaged one whose root hash the index
    # matches; otherwise it is unknown.
    opened = Opened(h, None, damage, container_id=h.root_hash.hex() if root_ok or not damage
                    else None)
    if not root_ok and not damage:
        opened.damage.append(Damage("index", "index", h.index_offset, h.index_length,
                                    "BLAKE3 differs from the root hash in the header",
                                    "index_hash_mismatch"))
        opened.notes.append("items not checked: the index that holds their hashes is damaged")
        return opened
    try:
        opened.sections = parse_index(index, h)[1].all
    except FormatError as e:
        if root_ok and not damage:
            raise Unverifiable(str(e), e.code) from None
        opened.notes.append(f"items not checked: the index cannot be used ({e})")
        return opened
    if not root_ok:
        opened.notes.append("the root hash in the damaged header does not match the index; "
                            "items were checked against the unauthenticated index")
    return opened
