"""compressed-tensors `pack-quantized` integer weights (Kimi K2 Thinking / K2.5 / K2.6 INT4
experts), dequantised to float32 with numpy.

A quantised `X.weight` is stored as three tensors (compressed-tensors' pack-quantized format):
- `X.weight_packed`: int32 `[rows, ceil(cols·B/32)]`. Each row is one little-endian bit stream,
  word after word, bits from the least significant up; element `c` occupies bits `[c·B, c·B+B)`
  and holds `q + 2^(B-1)` (offset binary), so `q = u - 2^(B-1)` in `[-2^(B-1), 2^(B-1))`.
  For B = 4: eight values per word, element `c` in bits `4·(c mod 8)` of word `c div 8`.
- `X.weight_scale`: float `[rows, cols/G]` (strategy `group`, group size G; `cols` must be a
  multiple of G) or `[rows, 1]` (strategy `channel`).
- `X.weight_shape`: the original `[rows, cols]` (integer tensor of two elements).
Symmetric schemes only (no zero point): `w[r, c] = q[r, c] · scale[r, c div G]`.

Only B in {1, 2, 4, 8} is read: for these the dense packing of compressed-tensors >= 0.1x and
the older word-aligned packing (`32/B` values per word, none split) are the same bytes; for
other widths the two differ and a checkpoint does not say which one wrote it.

The product is kept exact in float32 (q has at most 8 significant bits, a bf16/f16 scale at most
11): compressed-tensors' own `decompress` multiplies in the scale's dtype and rounds to it, so
with bf16 scales its weights are this value rounded to bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from moepack.convert.errors import SourceError

PACKED = "PACKED_INT"  # the dtype the checkpoint reader reports for a packed weight
BITS = (1, 2, 4, 8)
SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")


class PackedIntError(SourceError):
    """The source checkpoint's quantisation config or tensors are not a pack-quantized layout
    moepack reads (a source problem, not a container FormatError)."""


@dataclass(frozen=True)
class PackedScheme:
    num_bits: int
    group_size: int | None  # None: one scale per row (strategy "channel")


def _groups(qc: dict) -> list[dict]:
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise PackedIntError("quantization_config.config_groups must be an object")
    return [g for g in groups.values() if isinstance(g, dict)]


def scheme_from_config(config: dict) -> PackedScheme | None:
    """The pack-quantized weight scheme of config.json (its `quantization_config`, at the top
    level or in `text_config`), or None when the checkpoint has none."""
    qc = config.get("quantization_config")
    text = config.get("text_config")
    if qc is None and isinstance(text, dict):
        qc = text.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return None
    schemes = set()
    for g in _groups(qc):
        if g.get("format", qc.get("format")) != "pack-quantized":
            continue
        schemes.add(_scheme(g.get("weights")))
    if not schemes:
        return None
    if len(schemes) > 1:
        raise PackedIntError("quantization_config: several pack-quantized weight schemes "
                                f"({sorted(map(repr, schemes))[:3]}); one is supported")
    return schemes.pop()


def _scheme(w: Any) -> PackedScheme:
    if not isinstance(w, dict):
        raise PackedIntError("quantization_config: a pack-quantized group has no 'weights'")
    bits, kind, strategy = w.get("num_bits"), w.get("type", "int"), w.get("strategy")
    if kind != "int" or bits not in BITS or isinstance(bits, bool):
        raise PackedIntError(f"quantization_config: pack-quantized {kind!r} weights of "
                                f"{bits!r} bits are not supported (int, {BITS} bits)")
    if w.get("symmetric", True) is not True:
        raise PackedIntError("quantization_config: asymmetric (zero-point) pack-quantized "
                                "weights are not supported")
    if w.get("actorder") not in (None, "static", "weight"):
        raise PackedIntError(f"quantization_config: actorder {w.get('actorder')!r} "
                                "(permuted groups) is not supported")
    if strategy == "channel":
        return PackedScheme(bits, None)
    size = w.get("group_size")
    if strategy != "group" or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise PackedIntError(f"quantization_config: strategy {strategy!r} with group_size "
                                f"{size!r} is not supported (group with a size >= 1, channel)")
    return PackedScheme(bits, size)


def packed_words(cols: int, bits: int) -> int:
    """int32 words per row of `cols` elements."""
    return -(-cols * bits // 32)


def unpack(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Signed integers `[rows, cols]` (int8) from packed int32 `[rows, words]`."""
    rows = words.shape[0]
    raw = np.ascontiguousarray(words).astype("<i4", copy=False).view(np.uint8).reshape(rows, -1)
    if bits == 8:
        u = raw[:, :cols]
    elif bits == 4:
        u = np.stack((raw & 0xF, raw >> 4), axis=-1).reshape(rows, -1)[:, :cols]
    else:
        stream = np.unpackbits(raw, axis=1, bitorder="little")[:, :cols * bits]
        weights = (1 << np.arange(bits, dtype=np.uint16)).astype(np.uint16)
        u = (stream.reshape(rows, cols, bits).astype(np.uint16) * weights).sum(-1)
    return (u.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)


def dequantize(q: np.ndarray, scale: np.ndarray, group: int | None) -> np.ndarray:
    """`q · scale` per group of `group` columns (None: one scale per row), float32."""
    rows, cols = q.shape
    g = cols if group is None else group
    s = np.repeat(scale.astype(np.float32, copy=False), g, axis=1)[:, :cols]
    return np.ascontiguousarray(q.astype(np.float32) * s)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of `unpack` (tests, and building quantised fixtures): int32 `[rows, words]`."""
    rows, cols = q.shape
    u = (q.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
    stream = np.unpackbits(u[..., None], axis=-1, bitorder="little")[..., :bits]
    stream = stream.reshape(rows, cols * bits)
    width = packed_words(cols, bits) * 32
    stream = np.pad(stream, ((0, 0), (0, width - cols * bits)))
    raw = np.packbits(stream, axis=1, bitorder="little")
    return raw.view("<i4").reshape(rows, -1).astype(np.int32)
