"""The rvq codec of routed-expert projections (spec/CODECS.md §3-4): per row, vectors of 8
columns coded as sums of `stages` entries of the layer's codebooks, codes in 64-row tiles, then
f16 row scales; optionally a random-sign Hadamard rotation of the input dimension."""

from __future__ import annotations

import numpy as np
from moepack.format.codec_base import Codec, align_up, bad_codec, int_field
from moepack.format.errors import FormatError

RVQ_DIM = 8
RVQ_ENTRIES = 256
RVQ_MAX_STAGES = 8
RVQ_TILE = 64  # rows per code tile (format 1.1): one lookup table serves 64 rows at once
ROTATIONS = ("none", "hadamard")


def codebook_shape(codec: dict) -> tuple[int, int, int]:
    """Shape of the `layers.L.experts.P.codebook` tensor an rvq codec refers to."""
    return (codec["stages"], codec["entries"], codec["dim"])


def rotation_shape(codec: dict, shape) -> tuple[int, ...] | None:
    """Shape of the `layers.L.experts.P.rotation` tensor (±1 signs, one per column), or None."""
    return (shape[1],) if codec.get("rotation", "none") == "hadamard" else None


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
    padded = np.zeros((align_up(rows, RVQ_TILE), j), np.uint8)
    padded[:rows] = codes.reshape(rows, j)
    return np.ascontiguousarray(padded.reshape(-1, RVQ_TILE, j).transpose(0, 2, 1))


def untile(codec: dict, shape, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes [rows, nv, S] u8, scales [rows] f32) of one rvq tensor's size-checked bytes."""
    rows, cols = shape
    nv, s = -(-cols // RVQ_DIM), codec["stages"]
    ncodes = align_up(rows, RVQ_TILE) * nv * s
    tiles = buf[:ncodes].reshape(-1, nv * s, RVQ_TILE)
    codes = tiles.transpose(0, 2, 1).reshape(-1, nv, s)[:rows]
    return codes, buf[ncodes:].view("<f2").astype(np.float32)


class Rvq(Codec):
    name = "rvq"
    keys = frozenset({"stages", "dim", "entries", "rotation", "rotation_block"})
    encoder = "moepack.convert.quant.rvq:encode_codec"

    def check(self, codec: dict, shape: tuple[int, ...]) -> None:
        stages = int_field(codec, "stages")
        if not 1 <= stages <= RVQ_MAX_STAGES:
            raise bad_codec(f"codec 'rvq': stages {stages} not in 1..{RVQ_MAX_STAGES}")
        if int_field(codec, "dim") != RVQ_DIM or int_field(codec, "entries") != RVQ_ENTRIES:
            raise bad_codec(f"codec 'rvq': only dim {RVQ_DIM} and entries {RVQ_ENTRIES} exist")
        rot = codec.get("rotation", "none")
        if rot not in ROTATIONS:
            raise bad_codec(f"codec 'rvq': rotation {rot!r} not in {list(ROTATIONS)}")
        if rot == "hadamard":
            b = int_field(codec, "rotation_block")
            if b < 1 or b & (b - 1) or shape[1] % b:
                raise bad_codec(
                    f"codec 'rvq': rotation_block {b} must be a power of two dividing cols "
                    f"{shape[1]}"
                )
        elif "rotation_block" in codec:
            raise bad_codec("codec 'rvq': rotation_block given without rotation 'hadamard'")

    def nbytes(self, codec: dict, shape: tuple[int, ...]) -> int:
        rows, cols = shape
        nv = -(-cols // codec["dim"])
        return align_up(rows, RVQ_TILE) * nv * codec["stages"] + 2 * rows

    def decode(self, codec, shape, buf, codebook, rotation) -> np.ndarray:
        rows, cols = shape
        s = codec["stages"]
        if codebook is None:
            raise FormatError("codec 'rvq': decoding needs the layer's codebook tensor",
                              "rvq_reference")
        cb = np.asarray(codebook, dtype=np.float32)
        if cb.shape != codebook_shape(codec):
            want = list(codebook_shape(codec))
            raise FormatError(f"codec 'rvq': codebook shape {list(cb.shape)} != {want}",
                              "rvq_reference")
        codes, scales = untile(codec, shape, buf)
        acc = cb[0][codes[..., 0]]
        for st in range(1, s):  # stages summed in order, in f32
            acc = acc + cb[st][codes[..., st]]
        out = np.ascontiguousarray(acc.reshape(rows, -1)[:, :cols]) * scales[:, None]
        if codec.get("rotation", "none") == "hadamard":
            if rotation is None:
                raise FormatError(
                    "codec 'rvq': rotation 'hadamard' needs the layer's rotation tensor",
                    "rvq_reference")
            signs = np.asarray(rotation, dtype=np.float32)
            if signs.shape != (cols,) or not np.all(np.abs(signs) == 1.0):
                raise FormatError(f"codec 'rvq': rotation must be {cols} signs (+1/-1)",
                                  "rvq_reference")
            block = codec["rotation_block"]
            fwht_(out, block)
            out = out * inv_sqrt_block(block) * signs
        return out
