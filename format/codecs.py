"""Codec size rules, validation and reference decoders (spec/FORMAT.md §8, spec/CODECS.md).

The decoders here define the semantics: every float operation is f32, in the order CODECS.md
states, so the C decoders in runtime/src/codec.c reproduce them bit for bit.
"""

from __future__ import annotations

from math import prod

import numpy as np
from moepack.format.errors import FormatError

GROUP_SIZES = (16, 32, 64, 128, 256)
RVQ_DIM = 8
RVQ_ENTRIES = 256
RVQ_MAX_STAGES = 8
RVQ_TILE = 64  # rows per code tile (format 1.1): one lookup table serves 64 rows at once
ROTATIONS = ("none", "hadamard")
_CODEC_KEYS = {
    "f32": set(),
    "f16": set(),
    "bf16": set(),
    "q8": {"group_size"},
    "q4": {"group_size", "zero_point"},
    "q6": {"group_size"},
    "rvq": {"stages", "dim", "entries", "rotation", "rotation_block"},
}


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
    if name == "q6":
        g = codec["group_size"]
        cols_p = _align_up(cols, g)
        return 2 * rows * (cols_p // g) + rows * cols_p * 3 // 4
    if name == "rvq":
        nv = -(-cols // codec["dim"])
        return _align_up(rows, RVQ_TILE) * nv * codec["stages"] + 2 * rows
    raise FormatError(f"unknown codec {name!r}")


def _int_field(codec: dict, key: str) -> int:
    v = codec.get(key)
    if type(v) is not int:  # bool is an int subclass: refuse it too
        raise FormatError(f"codec {codec.get('name')!r}: {key!r} must be an integer, got {v!r}")
    return v


def validate_codec(codec: dict, shape) -> None:
    """Raise FormatError unless `codec` is a well-formed codec object usable for `shape`."""
    if not isinstance(codec, dict):
        raise FormatError(f"codec must be an object, got {type(codec).__name__}")
    name = codec.get("name")
    if name not in _CODEC_KEYS:
        raise FormatError(f"unknown codec {name!r}")
    extra = set(codec) - _CODEC_KEYS[name] - {"name"}
    if extra:
        raise FormatError(f"codec {name!r}: unknown keys {sorted(extra)}")
    shape = tuple(shape)
    if not shape or any(type(d) is not int or d < 1 for d in shape):
        raise FormatError(f"codec {name!r}: bad shape {list(shape)}")
    if name in ("f32", "f16", "bf16"):
        return
    if len(shape) != 2:
        raise FormatError(f"codec {name!r} needs a 2-D shape, got {list(shape)}")
    if name in ("q8", "q4", "q6"):
        g = _int_field(codec, "group_size")
        if g not in GROUP_SIZES:
            raise FormatError(f"codec {name!r}: group_size {g} not in {list(GROUP_SIZES)}")
        if name == "q4" and not isinstance(codec.get("zero_point", False), bool):
            raise FormatError("codec 'q4': zero_point must be true or false")
        return
    stages = _int_field(codec, "stages")
    if not 1 <= stages <= RVQ_MAX_STAGES:
        raise FormatError(f"codec 'rvq': stages {stages} not in 1..{RVQ_MAX_STAGES}")
    if _int_field(codec, "dim") != RVQ_DIM or _int_field(codec, "entries") != RVQ_ENTRIES:
        raise FormatError(f"codec 'rvq': only dim {RVQ_DIM} and entries {RVQ_ENTRIES} exist")
    rot = codec.get("rotation", "none")
    if rot not in ROTATIONS:
        raise FormatError(f"codec 'rvq': rotation {rot!r} not in {list(ROTATIONS)}")
    if rot == "hadamard":
        b = _int_field(codec, "rotation_block")
        if b < 1 or b & (b - 1) or shape[1] % b:
            raise FormatError(
                f"codec 'rvq': rotation_block {b} must be a power of two dividing cols {shape[1]}"
            )
    elif "rotation_block" in codec:
        raise FormatError("codec 'rvq': rotation_block given without rotation 'hadamard'")


def uses_rvq(entry: dict) -> bool:
    """Whether an index section entry (a tensor, or a bank through its parts) holds rvq codes."""
    codecs = [entry.get("codec")] + [p.get("codec") for p in entry.get("parts") or ()
                                     if isinstance(p, dict)]
    return any(isinstance(c, dict) and c.get("name") == "rvq" for c in codecs)


def codebook_shape(codec: dict) -> tuple[int, int, int]:
    """Shape of the `layers.L.experts.P.codebook` tensor an rvq codec refers to."""
    return (codec["stages"], codec["entries"], codec["dim"])


def rotation_shape(codec: dict, shape) -> tuple[int, ...] | None:
    """Shape of the `layers.L.experts.P.rotation` tensor (±1 signs, one per column), or None."""
    return (shape[1],) if codec.get("rotation", "none") == "hadamard" else None


def _buffer(data, nbytes: int, name: str) -> np.ndarray:
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != nbytes:
        raise FormatError(f"codec {name!r}: expected {nbytes} bytes, got {buf.size}")
    return buf


def fwht_(x: np.ndarray, block: int) -> np.ndarray:
    """In-place unnormalised Walsh-Hadamard transform of each `block` of the last axis (f32).

    Butterfly order h = 1, 2, 4, ...; pair (j, j+h) becomes (a+b, a-b): each element gets exactly
    the f32 operations of the C loop, so results are bit-identical.
    """
    lead = x.shape[:-1]
    n = x.shape[-1]
    h = 1
    while h < block:
        v = x.reshape(*lead, n // (2 * h), 2, h)
        a = v[..., 0, :].copy()
        b = v[..., 1, :]
        v[..., 0, :] = a + b
        v[..., 1, :] = a - b
        h *= 2
    return x


def inv_sqrt_block(block: int) -> np.float32:
    """f32(1/sqrt(block)), rounded once from double (the constant of CODECS.md §4)."""
    return np.float32(1.0 / np.sqrt(np.float64(block)))


def rvq_tile_codes(codes: np.ndarray) -> np.ndarray:
    """Codes [rows, nv, S] -> the tiled code array [nt, nv*S, 64] of CODECS.md §3 (u8).

    Padding rows of the last tile get code 0.
    """
    rows = codes.shape[0]
    j = codes.shape[1] * codes.shape[2]
    padded = np.zeros((_align_up(rows, RVQ_TILE), j), np.uint8)
    padded[:rows] = codes.reshape(rows, j)
    return np.ascontiguousarray(padded.reshape(-1, RVQ_TILE, j).transpose(0, 2, 1))


def rvq_codes(codec: dict, shape, data) -> tuple[np.ndarray, np.ndarray]:
    """(codes [rows, nv, S] u8, scales [rows] f32) of one rvq tensor's bytes (size-checked)."""
    validate_codec(codec, shape)
    rows, cols = shape
    buf = _buffer(data, encoded_nbytes(codec, tuple(shape)), "rvq")
    nv, s = -(-cols // RVQ_DIM), codec["stages"]
    ncodes = _align_up(rows, RVQ_TILE) * nv * s
    tiles = buf[:ncodes].reshape(-1, nv * s, RVQ_TILE)
    codes = tiles.transpose(0, 2, 1).reshape(-1, nv, s)[:rows]
    return codes, buf[ncodes:].view("<f2").astype(np.float32)


def _decode_rvq(codec, rows, cols, buf, codebook, rotation) -> np.ndarray:
    s = codec["stages"]
    if codebook is None:
        raise FormatError("codec 'rvq': decoding needs the layer's codebook tensor")
    cb = np.asarray(codebook, dtype=np.float32)
    if cb.shape != codebook_shape(codec):
        want = list(codebook_shape(codec))
        raise FormatError(f"codec 'rvq': codebook shape {list(cb.shape)} != {want}")
    codes, scales = rvq_codes(codec, (rows, cols), buf)
    acc = cb[0][codes[..., 0]]
    for st in range(1, s):  # stages summed in order, in f32
        acc = acc + cb[st][codes[..., st]]
    out = np.ascontiguousarray(acc.reshape(rows, -1)[:, :cols]) * scales[:, None]
    if codec.get("rotation", "none") == "hadamard":
        if rotation is None:
            raise FormatError("codec 'rvq': rotation 'hadamard' needs the layer's rotation tensor")
        signs = np.asarray(rotation, dtype=np.float32)
        if signs.shape != (cols,) or not np.all(np.abs(signs) == 1.0):
            raise FormatError(f"codec 'rvq': rotation must be {cols} signs (+1/-1)")
        block = codec["rotation_block"]
        fwht_(out, block)
        out = out * inv_sqrt_block(block) * signs
    return out


def _unpack_q6(packed: np.ndarray, rows: int, cols_p: int) -> np.ndarray:
    """6-bit codes [rows][cols_p]: 4 per 3 bytes, u = b0 | b1<<8 | b2<<16 = k0 | k1<<6 | ..."""
    b = packed.reshape(rows, cols_p // 4, 3).astype(np.uint32)
    u = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    k = np.empty((rows, cols_p // 4, 4), np.uint8)
    for i in range(4):
        k[..., i] = (u >> (6 * i)) & 63
    return k.reshape(rows, cols_p)


def _decode_group(codec, rows, cols, buf) -> np.ndarray:
    g = codec["group_size"]
    cp = _align_up(cols, g)
    ng = cp // g
    scales = buf[: 2 * rows * ng].view("<f2").astype(np.float32).reshape(rows, ng, 1)
    if codec["name"] == "q8":
        q = buf[2 * rows * ng :].view(np.int8).astype(np.float32).reshape(rows, ng, g)
        return (scales * q).reshape(rows, cp)[:, :cols]
    if codec["name"] == "q6":
        k = _unpack_q6(buf[2 * rows * ng :], rows, cp).astype(np.float32).reshape(rows, ng, g)
        return (scales * (k - np.float32(32))).reshape(rows, cp)[:, :cols]
    zp = bool(codec.get("zero_point"))
    off = 2 * rows * ng * (2 if zp else 1)
    packed = buf[off:].reshape(rows, cp // 2)
    nib = np.empty((rows, cp), dtype=np.uint8)
    nib[:, 0::2] = packed & 15  # even column in the low nibble
    nib[:, 1::2] = packed >> 4
    q = nib.astype(np.float32).reshape(rows, ng, g)
    if zp:
        mins = buf[2 * rows * ng : off].view("<f2").astype(np.float32).reshape(rows, ng, 1)
        out = scales * q + mins
    else:
        out = scales * (q - np.float32(8))
    return out.reshape(rows, cp)[:, :cols]


def decode(codec: dict, shape, data, *, codebook=None, rotation=None) -> np.ndarray:
    """Reference decode of `data` (bytes-like) to a float32 array of `shape`."""
    validate_codec(codec, shape)
    shape = tuple(shape)
    name = codec["name"]
    buf = _buffer(data, encoded_nbytes(codec, shape), name)
    if name == "f32":
        return buf.view("<f4").astype(np.float32).reshape(shape)
    if name == "f16":
        return buf.view("<f2").astype(np.float32).reshape(shape)
    if name == "bf16":
        return (buf.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    rows, cols = shape
    with np.errstate(all="ignore"):  # inf/NaN scales decode to inf/NaN, as in C, silently
        if name == "rvq":
            out = _decode_rvq(codec, rows, cols, buf, codebook, rotation)
        else:
            out = _decode_group(codec, rows, cols, buf)
    return np.ascontiguousarray(out, dtype=np.float32)
