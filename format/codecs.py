"""Codec size rules and reference decoders (spec/FORMAT.md section 8).

Placeholder with the size rules only; the codec work fills in decode and the q4/rvq details.
"""

from __future__ import annotations

from math import prod

from moepack.format.errors import FormatError


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def encoded_nbytes(codec: dict, shape: tuple[int, ...]) -> int:
    """Exact encoded size in bytes of a tensor of `shape` under `codec`."""
    name = codec.get("name")
    if name in ("f32", "f16", "bf16"):
        return prod(shape) * (4 if name == "f32" else 2)
    if len(shape) != 2:
        raise FormatError(f"codec {name!r} needs a 2-D shape, got {list(shape)}")
    rows, cols = shape
    if name == "q8":
        g = codec["group_size"]
        cols_p = _align_up(cols, g)
        return 2 * rows * (cols_p // g) + rows * cols_p
    if name == "q4":
        g = codec["group_size"]
        cols_p = _align_up(cols, g)
        planes = 2 if codec.get("zero_point") else 1
        return 2 * planes * rows * (cols_p // g) + rows * cols_p // 2
    if name == "rvq":
        nv = -(-cols // codec["dim"])
        return _align_up(rows * nv * codec["stages"], 64) + 2 * rows
    raise FormatError(f"unknown codec {name!r}")
