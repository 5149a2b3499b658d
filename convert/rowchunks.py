"""Encode a large 2-D trunk tensor (an embedding of 129k x 7k is 3.7 GB in f32) a band of rows at
a time, so peak memory is the encoded output plus one band, not ~5 copies of the whole tensor.

Every trunk codec (spec/CODECS.md §1–2) stores "planes" one after another (e.g. q8: f16 scales
`[rows][ng]`, then int8 `q[rows][cols_p]`), each with a fixed number of bytes per row and each row
encoded independently. Encoding a band yields the same planes for those rows, which land at
`plane_start + first_row * bytes_per_row` in the full output: the result is byte-identical to
encoding the whole tensor at once (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from moepack.convert.quant import encode

BAND_BYTES = 64 << 20   # f32 bytes of source rows per band
ROW_MULTIPLE = 128      # bands start at multiples of this (fp8 scale blocks are 128 rows)


def row_planes(codec: dict, cols: int) -> list[int] | None:
    """Bytes per row of each plane of `codec` for a `[rows, cols]` tensor, or None if unknown."""
    name = codec["name"]
    if name in ("f32", "f16", "bf16"):
        return [cols * (4 if name == "f32" else 2)]
    if name in ("q8", "q6", "q4"):
        g = codec["group_size"]
        cols_p = -(-cols // g) * g
        ng = cols_p // g
        if name == "q8":
            return [2 * ng, cols_p]
        if name == "q6":
            return [2 * ng, cols_p * 3 // 4]
        return [2 * ng, 2 * ng, cols_p // 2] if codec.get("zero_point") else [2 * ng, cols_p // 2]
    return None


def band_rows(cols: int, band_bytes: int = BAND_BYTES) -> int:
    return max(ROW_MULTIPLE, band_bytes // max(1, cols * 4) // ROW_MULTIPLE * ROW_MULTIPLE)


def encode_by_rows(codec: dict, shape: tuple[int, ...],
                   read_rows: Callable[[int, int], np.ndarray], *, threads: int = 1,
                   band: int | None = None) -> bytes | bytearray:
    """`encode(codec, w)` for w = rows `0..shape[0]` delivered by `read_rows(lo, hi)`."""
    planes = row_planes(codec, shape[-1]) if len(shape) == 2 else None
    rows = shape[0]
    band = band or band_rows(shape[-1])
    if planes is None or rows <= band:
        return encode(codec, read_rows(0, rows), threads=threads)
    out = bytearray(sum(planes) * rows)
    starts = [rows * sum(planes[:k]) for k in range(len(planes))]
    for lo in range(0, rows, band):
        hi = min(rows, lo + band)
        data = memoryview(encode(codec, read_rows(lo, hi), threads=threads))
        pos = 0
        for start, per in zip(starts, planes, strict=True):
            n = per * (hi - lo)
            out[start + lo * per: start + lo * per + n] = data[pos:pos + n]
            pos += n
        if pos != len(data):
            raise ValueError(f"codec {codec['name']}: {len(data)} bytes for rows {lo}..{hi}, "
                             f"expected {pos} (plane layout changed?)")
    return out
