"""Passthrough float codecs: f32, f16, bf16 (round to nearest even)."""

from __future__ import annotations

import numpy as np
from moepack.convert.quant.refs import EncodeRefs


def encode_codec(codec: dict, w: np.ndarray, refs: EncodeRefs) -> bytes:
    """The f32/f16/bf16 encoder (format.codec_float)."""
    return encode_float(codec["name"], w)


def encode_float(name: str, w: np.ndarray) -> bytes:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if name == "f32":
        return w.astype("<f4").tobytes()
    if name == "f16":
        return w.astype("<f2").tobytes()
    if name == "bf16":
        u = w.view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        r = np.where(np.isnan(w), (u >> 16).astype(np.uint16) | 0x40, r)  # keep NaN a NaN
        return r.astype("<u2").tobytes()
    raise ValueError(f"not a float codec: {name!r}")
