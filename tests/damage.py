"""Damage or rewrite a file in place, for tests of integrity checks."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
from moepack.format.canonical import canonical_json
from moepack.format.header import parse_header
from moepack.format.limits import HEADER_SIZE


def flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    """XOR the byte at `offset` with `mask`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def edit_manifest(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply `edit` to the container's manifest and reseal it as a writer would (FORMAT.md
    §12): canonical index at the same offset, then root hash, sizes and header hash. The
    result is a valid container with a new ID."""
    data = path.read_bytes()
    h = parse_header(data[:HEADER_SIZE], len(data))
    doc = json.loads(data[h.index_offset:])
    edit(doc["manifest"])
    index = canonical_json(doc)
    new = dataclasses.replace(h, file_size=h.index_offset + len(index), index_length=len(index),
                              root_hash=blake3.blake3(index).digest())
    path.write_bytes(new.pack() + data[HEADER_SIZE:h.index_offset] + index)


def reseal(data: bytes, index: bytes) -> bytes:
    """`data` (a container's bytes) with its index replaced and every header field that depends
    on it recomputed: file size, index length, root hash, header hash."""
    off = struct.unpack_from("<Q", data, 32)[0]
    out = bytearray(data[:off] + index)
    struct.pack_into("<QQQ", out, 24, len(out), off, len(index))
    out[48:80] = blake3.blake3(index).digest()
    out[96:128] = blake3.blake3(bytes(out[:96])).digest()
    return bytes(out)
