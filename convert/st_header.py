"""Strict validation of a safetensors file header (read without touching the tensor data).

safetensors' own checks report a damaged shard without naming the tensor; these name file and
tensor, so a user knows which download to repeat.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

from moepack.convert.errors import SourceError
from moepack.format.model_desc import (
    MAX_HEADER_BYTES,
    MAX_JSON_BYTES,
    MAX_TENSOR_DIMS,
    MAX_TENSORS,
    SOURCE_JSON_DEPTH,
)

from moepack.untrusted_json import loads

DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I64": 8,
               "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER = MAX_HEADER_BYTES


@dataclass(frozen=True)
class TensorInfo:
    file: str          # file name inside the checkpoint directory
    dtype: str
    shape: tuple[int, ...]
    start: int         # absolute file offsets of the tensor bytes
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor table of one safetensors file, validated against the file's real size."""
    name = path.name
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise SourceError(f"{name}: truncated safetensors file ({size} bytes, no header)")
            (hlen,) = struct.unpack("<Q", raw_len)
            if hlen > MAX_HEADER or 8 + hlen > size:
                raise SourceError(
                    f"{name}: corrupt safetensors header: header length {hlen} does not fit "
                    f"in the {size}-byte file")
            raw = f.read(hlen)
    except OSError as e:
        raise SourceError(f"{name}: cannot read: {e.strerror or e}") from e
    header = parse_json(raw, f"{name}: corrupt safetensors header", MAX_HEADER)
    if not isinstance(header, dict):
        raise SourceError(f"{name}: corrupt safetensors header: not a JSON object")
    if len(header) > MAX_TENSORS + 1:
        raise SourceError(f"{name}: corrupt safetensors header: {len(header):,} entries (at most "
                          f"{MAX_TENSORS:,} tensors are accepted)")
    base = 8 + hlen
    table: dict[str, TensorInfo] = {}
    for tname, meta in header.items():
        if tname == "__metadata__":
            continue
        table[tname] = _entry(name, tname, meta, base)
    _check_extents(name, table, base, size)
    return table


def parse_json(raw: bytes, where: str, max_bytes: int = MAX_JSON_BYTES) -> object:
    """Untrusted JSON (config.json, index, header) through the shared bounded loader: size and
    nesting depth checked before parsing, every failure one SourceError starting with `where`."""
    return loads(raw, where, max_bytes=max_bytes, max_depth=SOURCE_JSON_DEPTH, error=SourceError)


def _entry(fname: str, tname: str, meta: object, base: int) -> TensorInfo:
    where = f"{fname}: tensor {_short(tname)}"
    if not isinstance(meta, dict):
        raise SourceError(f"{where}: corrupt safetensors header entry")
    dtype, shape, offs = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise SourceError(f"{where}: unknown dtype {_short(dtype)}")
    if not (isinstance(shape, list) and len(shape) <= MAX_TENSOR_DIMS
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise SourceError(f"{where}: corrupt shape {_short(shape)} (at most {MAX_TENSOR_DIMS} "
                          "non-negative integer dimensions)")
    if not (isinstance(offs, list) and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)
            and offs[0] <= offs[1]):
        raise SourceError(f"{where}: corrupt data_offsets {_short(offs)}")
    if offs[1] - offs[0] != prod(shape) * DTYPE_SIZES[dtype]:
        raise SourceError(f"{where}: data_offsets {_short(offs)} disagree with shape "
                          f"{_short(shape)} {dtype}")
    return TensorInfo(fname, dtype, tuple(shape), base + offs[0], base + offs[1])


def _check_extents(fname: str, table: dict[str, TensorInfo], base: int, size: int) -> None:
    pos = base
    for t_name, t in sorted(table.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if t.start != pos:
            raise SourceError(f"{fname}: corrupt safetensors header: tensor {t_name!r} starts at "
                              f"{t.start}, expected {pos} (gap or overlap)")
        if t.end > size:
            raise SourceError(f"{fname}: truncated: tensor {t_name!r} needs bytes up to {t.end} "
                              f"but the file has {size} bytes (download it again)")
        pos = t.end
    if pos != size:
        raise SourceError(f"{fname}: {size - pos} unexpected bytes after the last tensor "
                          f"(file is {size} bytes, tensors end at {pos})")


def _short(value: object, limit: int = 80) -> str:
    """repr of an untrusted value, cut short so one message stays one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
