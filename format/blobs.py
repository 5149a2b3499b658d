"""Bounded zstd decoding of blobs (spec/FORMAT.md section 4.2): exactly one frame, exact size."""

from __future__ import annotations

import zstandard
from moepack.format.errors import FormatError

_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20


def _frame_length(data: bytes | memoryview, where: str) -> int:
    """Compressed size of the zstd frame at the start of `data` (RFC 8878 section 3.1.1)."""
    if len(data) < 6 or bytes(data[:4]) != _MAGIC:
        raise FormatError(f"{where}: not a zstd frame (bad frame magic)", "blob_frame")
    try:
        pos = zstandard.frame_header_size(bytes(data[:18]))
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: bad zstd frame header: {e}", "blob_frame") from None
    has_checksum = data[4] & 0x04
    while True:
        if pos + 3 > len(data):
            raise FormatError(f"{where}: zstd frame truncated at byte {pos}", "blob_frame")
        bh = int.from_bytes(data[pos : pos + 3], "little")
        last, kind, size = bh & 1, (bh >> 1) & 3, bh >> 3
        if kind == 3:
            raise FormatError(f"{where}: reserved zstd block type at byte {pos}", "blob_frame")
        pos += 3 + (1 if kind == 1 else size)  # an RLE block stores one byte
        if last:
            return pos + (4 if has_checksum else 0)


def decompress_blob(data: bytes | memoryview, raw_length: int, where: str) -> bytes:
    """Decompress one zstd frame that must fill `data` and yield exactly `raw_length` bytes.

    Output grows only as real output is produced and never past raw_length + 1 bytes.
    """
    n = _frame_length(data, where)
    if n != len(data):
        raise FormatError(f"{where}: zstd frame is {n} bytes but the blob holds {len(data)}",
                          "blob_frame")
    out = bytearray()
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(bytes(data), read_across_frames=False)
        while len(out) <= raw_length:
            chunk = reader.read(min(_CHUNK, raw_length + 1 - len(out)))
            if not chunk:
                break
            out += chunk
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: zstd decompression failed: {e}", "blob_frame") from None
    if len(out) != raw_length:
        got = f"more than {raw_length}" if len(out) > raw_length else str(len(out))
        raise FormatError(f"{where}: decompressed to {got} bytes, raw_length says {raw_length}",
                          "blob_decoded_length")
    return bytes(out)
