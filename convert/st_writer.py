"""Streaming safetensors writer: the header is computed from shapes first, then tensors are
written one at a time, so exporting never holds more than one tensor in memory."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from math import prod
from pathlib import Path

import numpy as np
from moepack.convert.quant.dense import encode_float

from moepack.durable import naming
from moepack.safefs import open_new

# export dtype -> (safetensors dtype, bytes per element, encoder name)
DTYPES = {"f32": ("F32", 4), "f16": ("F16", 2), "bf16": ("BF16", 2)}
TORCH_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def tensor_nbytes(shape: Sequence[int], dtype: str) -> int:
    return prod(shape) * DTYPES[dtype][1]


def write_safetensors(path: Path, entries: Sequence[tuple[str, tuple[int, ...]]], dtype: str,
                      produce: Callable[[str], np.ndarray]) -> None:
    """Write `entries` (name, shape) in order; `produce(name)` returns each tensor as float32."""
    st_dtype, _ = DTYPES[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, shape in entries:
        n = tensor_nbytes(shape, dtype)
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes with spaces
    # a new inode, never through a link planted at `path` (moepack.safefs); a full disk or
    # RLIMIT_FSIZE names the file
    with naming(path), os.fdopen(open_new(path, replace=True), "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, shape in entries:
            w = produce(name)
            if tuple(w.shape) != tuple(shape):
                raise ValueError(f"{name}: produced shape {list(w.shape)}, planned {list(shape)}")
            f.write(encode_float(dtype, w))
        f.flush()
        os.fsync(f.fileno())
