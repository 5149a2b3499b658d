"""The codec table and the codec-generic checks (spec/FORMAT.md §8, spec/CODECS.md).

Each codec is one class (moepack.format.codec_*): keys, checks, encoded size, reference decode
and the name of its encoder. The reference decoders define the semantics: every float operation
is f32, in the order CODECS.md states, and the engine's kernels reproduce them bit for bit.
Adding a codec: write its class, list it in CODECS (and its C trait, runtime/src/codecs.c).
"""

from __future__ import annotations

import numpy as np
from moepack.format.codec_base import Codec, bad_codec
from moepack.format.codec_float import BF16, F16, F32
from moepack.format.codec_group import GROUP_SIZES, Q4, Q6, Q8
from moepack.format.codec_rvq import (
    ROTATIONS,
    RVQ_DIM,
    RVQ_ENTRIES,
    RVQ_MAX_STAGES,
    RVQ_TILE,
    Rvq,
    codebook_shape,
    fwht_,
    inv_sqrt_block,
    rotation_shape,
    rvq_tile_codes,
    untile,
)
from moepack.format.errors import FormatError

CODECS: dict[str, Codec] = {c.name: c for c in (F32(), F16(), BF16(), Q8(), Q4(), Q6(), Rvq())}

__all__ = [
    "CODECS", "GROUP_SIZES", "ROTATIONS", "RVQ_DIM", "RVQ_ENTRIES", "RVQ_MAX_STAGES", "RVQ_TILE",
    "Codec", "codebook_shape", "codec_class", "decode", "encoded_nbytes", "fwht_",
    "inv_sqrt_block", "rotation_shape", "rvq_codes", "rvq_tile_codes", "uses_rvq",
    "validate_codec",
]


def codec_class(codec: dict) -> Codec:
    """The class of a codec object (FormatError for an unknown name)."""
    name = codec.get("name") if isinstance(codec, dict) else None
    if not isinstance(name, str) or name not in CODECS:
        raise FormatError(f"unknown codec {name!r}", "unknown_codec")
    return CODECS[name]


def _need_matrix(c: Codec, shape: tuple[int, ...]) -> None:
    if c.matrix and len(shape) != 2:
        raise bad_codec(f"codec {c.name!r} needs a 2-D shape, got {list(shape)}")


def encoded_nbytes(codec: dict, shape: tuple[int, ...]) -> int:
    """Exact encoded size in bytes of a tensor of `shape` under `codec`."""
    c = codec_class(codec)
    shape = tuple(shape)
    _need_matrix(c, shape)
    return c.nbytes(codec, shape)


def validate_codec(codec: dict, shape) -> None:
    """Raise FormatError unless `codec` is a well-formed codec object usable for `shape`."""
    if not isinstance(codec, dict):
        raise bad_codec(f"codec must be an object, got {type(codec).__name__}")
    c = codec_class(codec)
    extra = set(codec) - c.keys - {"name"}
    if extra:
        raise bad_codec(f"codec {c.name!r}: unknown keys {sorted(extra)}")
    shape = tuple(shape)
    if not shape or any(type(d) is not int or d < 1 for d in shape):
        raise bad_codec(f"codec {c.name!r}: bad shape {list(shape)}")
    _need_matrix(c, shape)
    c.check(codec, shape)


def uses_rvq(entry: dict) -> bool:
    """Whether an index section entry (a tensor, or a bank through its parts) holds rvq codes."""
    codecs = [entry.get("codec")] + [p.get("codec") for p in entry.get("parts") or ()
                                     if isinstance(p, dict)]
    return any(isinstance(c, dict) and c.get("name") == "rvq" for c in codecs)


def _buffer(data, nbytes: int, name: str) -> np.ndarray:
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != nbytes:
        raise FormatError(f"codec {name!r}: expected {nbytes} bytes, got {buf.size}",
                          "payload_length")
    return buf


def rvq_codes(codec: dict, shape, data) -> tuple[np.ndarray, np.ndarray]:
    """(codes [rows, nv, S] u8, scales [rows] f32) of one rvq tensor's bytes (size-checked)."""
    validate_codec(codec, shape)
    return untile(codec, tuple(shape), _buffer(data, encoded_nbytes(codec, shape), "rvq"))


def decode(codec: dict, shape, data, *, codebook=None, rotation=None) -> np.ndarray:
    """Reference decode of `data` (bytes-like) to a float32 array of `shape`."""
    validate_codec(codec, shape)
    shape = tuple(shape)
    c = CODECS[codec["name"]]
    buf = _buffer(data, c.nbytes(codec, shape), c.name)
    with np.errstate(all="ignore"):  # inf/NaN scales decode to inf/NaN, as in C, silently
        out = c.decode(codec, shape, buf, codebook, rotation)
    return np.ascontiguousarray(out, dtype=np.float32)
