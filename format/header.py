"""The 128-byte header (FORMAT.md section 2): packing for writers, checked parsing for readers."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import blake3
from moepack.format.errors import FormatError, reject
from moepack.format.limits import (
    HEADER_SIZE,
    KNOWN_REQUIRED_FLAGS,
    MAGIC,
    MAJOR,
    MAX_ALIGNMENT,
    MAX_INDEX_LENGTH,
    MIN_ALIGNMENT,
    MIN_INDEX_LENGTH,
    REQUIRED_FLAGS_MASK,
    SECTION_ALIGNMENT,
)

# magic, major, minor, flags, alignment, header_size, file_size, index_offset, index_length,
# root_hash, reserved; followed by header_hash (BLAKE3 of these 96 bytes).
_BODY = struct.Struct("<8sHHIIIQQQ32s16s")
assert _BODY.size == 96


@dataclass(frozen=True)
class Header:
    major: int
    minor: int
    flags: int
    alignment: int
    file_size: int
    index_offset: int
    index_length: int
    root_hash: bytes

    def pack(self) -> bytes:
        body = _BODY.pack(
            MAGIC, self.major, self.minor, self.flags, self.alignment, HEADER_SIZE,
            self.file_size, self.index_offset, self.index_length, self.root_hash, bytes(16),
        )
        return body + blake3.blake3(body).digest()


def _fail(code: str, field: str, offset: int, why: str) -> FormatError:
    return reject(code, f"header.{field}", why, offset)


def parse_header(head: bytes, real_size: int) -> Header:
    """Validate the header in spec order (FORMAT.md section 2.1) against the file's real size.

    `head` is the first min(real_size, 128) bytes of the file.
    """
    if real_size < HEADER_SIZE or len(head) < HEADER_SIZE:
        raise reject("truncated", None, f"truncated: file size {real_size} is below the "
                     f"{HEADER_SIZE}-byte header")
    head = bytes(head[:HEADER_SIZE])
    if head.count(0) == HEADER_SIZE:
        raise reject("unfinished", None,
                     "unfinished conversion: header is all zero (offset 0, 128 bytes)", 0)
    (magic, major, minor, flags, alignment, header_size, file_size, index_offset, index_length,
     root_hash, reserved) = _BODY.unpack(head[:96])
    if magic != MAGIC:
        raise _fail("bad_magic", "magic", 0, f"bad magic {magic.hex()} (not a moepack file)")
    if major != MAJOR:
        raise _fail("unsupported_major", "major", 8,
                    f"unsupported major version {major} (this reader supports {MAJOR})")
    if blake3.blake3(head[:96]).digest() != head[96:]:
        raise _fail("header_hash_mismatch", "header_hash", 96,
                    "header hash mismatch (header damaged)")
    if header_size != HEADER_SIZE:
        raise _fail("header_size", "header_size", 20, f"header_size {header_size} != {HEADER_SIZE}")
    unknown = flags & REQUIRED_FLAGS_MASK & ~KNOWN_REQUIRED_FLAGS
    if unknown:
        raise _fail("unknown_required_flag", "flags", 12,
                    f"unknown required flag bits 0x{unknown:04x}")
    if reserved.count(0) != len(reserved):
        raise _fail("reserved_nonzero", "reserved", 80, "reserved bytes are not zero")
    if not (MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT) or alignment & (alignment - 1):
        raise _fail("bad_alignment", "alignment", 16, f"alignment {alignment} is not a power of "
                    f"two in {MIN_ALIGNMENT}..{MAX_ALIGNMENT}")
    if file_size != real_size:
        raise _fail("file_size_mismatch", "file_size", 24,
                    f"file_size {file_size} != actual file size {real_size}")
    if not MIN_INDEX_LENGTH <= index_length <= MAX_INDEX_LENGTH:
        raise _fail("index_length", "index_length", 40,
                    f"index length {index_length} outside {MIN_INDEX_LENGTH}..{MAX_INDEX_LENGTH}")
    if index_offset < alignment or index_offset % SECTION_ALIGNMENT:
        raise _fail("index_offset", "index_offset", 32,
                    f"index offset {index_offset} must be >= alignment {alignment} and a "
                    f"multiple of {SECTION_ALIGNMENT}")
    if index_offset + index_length != file_size:
        raise _fail("index_extent", "index_offset", 32, f"index extent {index_offset}+"
                    f"{index_length} does not end at file size {file_size}")
    return Header(major, minor, flags, alignment, file_size, index_offset, index_length, root_hash)
