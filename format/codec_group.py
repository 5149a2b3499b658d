"""Group codecs q8, q6, q4: groups of G weights of a row share an f16 scale (spec/FORMAT.md §8.2,
spec/CODECS.md §2). Layout: f16 scales [rows][ngroups] (q4 with zero point: then f16 minima
[rows][ngroups]), then the codes of the rows padded to cols_p = ngroups·G columns."""

from __future__ import annotations

import numpy as np
from moepack.format.codec_base import Codec, align_up, bad_codec, int_field

GROUP_SIZES = (16, 32, 64, 128, 256)


class _GroupCodec(Codec):
    keys = frozenset({"group_size"})
    code_bits: int  # bits per code

    def check(self, codec: dict, shape: tuple[int, ...]) -> None:
        g = int_field(codec, "group_size")
        if g not in GROUP_SIZES:
            raise bad_codec(f"codec {self.name!r}: group_size {g} not in {list(GROUP_SIZES)}")

    def scale_planes(self, codec: dict) -> int:
        return 1

    def nbytes(self, codec: dict, shape: tuple[int, ...]) -> int:
        rows, cols = shape
        g = codec["group_size"]
        cols_p = align_up(cols, g)
        planes = self.scale_planes(codec)
        return 2 * planes * rows * (cols_p // g) + rows * cols_p * self.code_bits // 8

    def decode(self, codec, shape, buf, codebook, rotation) -> np.ndarray:
        rows, cols = shape
        g = codec["group_size"]
        cp = align_up(cols, g)
        ng = cp // g
        scales = buf[: 2 * rows * ng].view("<f2").astype(np.float32).reshape(rows, ng, 1)
        out = self.values(codec, buf, rows, cp, ng, scales)  # [rows, ng, g]
        return out.reshape(rows, cp)[:, :cols]

    def values(self, codec: dict, buf: np.ndarray, rows: int, cp: int, ng: int,
               scales: np.ndarray) -> np.ndarray:
        """[rows, ng, G]: scale × code, + the minimum with a zero point (the product rounded)"""
        k = self.codes(codec, buf, rows, cp, ng).astype(np.float32).reshape(rows, ng, -1)
        mins = self.minimums(codec, buf, rows, ng)
        return scales * k if mins is None else scales * k + mins[..., None]

    def codes(self, codec: dict, buf: np.ndarray, rows: int, cp: int, ng: int) -> np.ndarray:
        """The integer codes [rows, cp] a weight is its scale times (CODECS.md §2.4 step 2)"""
        raise NotImplementedError

    def minimums(self, codec: dict, buf: np.ndarray, rows: int, ng: int) -> np.ndarray | None:
        """f32 [rows, ng] with a zero point, else None"""
        return None


class Q8(_GroupCodec):
    """w = d·q, q int8."""

    name = "q8"
    code_bits = 8
    encoder = "moepack.convert.quant.groupq:encode_q8"

    def codes(self, codec, buf, rows, cp, ng) -> np.ndarray:
        return buf[2 * rows * ng :].view(np.int8).reshape(rows, cp).astype(np.int16)


def _unpack_q6(packed: np.ndarray, rows: int, cols_p: int) -> np.ndarray:
    """6-bit codes [rows][cols_p]: 4 per 3 bytes, u = b0 | b1<<8 | b2<<16 = k0 | k1<<6 | ..."""
    b = packed.reshape(rows, cols_p // 4, 3).astype(np.uint32)
    u = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    k = np.empty((rows, cols_p // 4, 4), np.uint8)
    for i in range(4):
        k[..., i] = (u >> (6 * i)) & 63
    return k.reshape(rows, cols_p)


class Q6(_GroupCodec):
    """w = d·(k - 32), k 6-bit, 4 codes per 3 bytes."""

    name = "q6"
    code_bits = 6
    encoder = "moepack.convert.quant.groupq:encode_q6"

    def codes(self, codec, buf, rows, cp, ng) -> np.ndarray:
        return _unpack_q6(buf[2 * rows * ng :], rows, cp).astype(np.int16) - 32


class Q4(_GroupCodec):
    """w = d·(q - 8), or with zero point w = d·q + m; two codes per byte, even column low."""

    name = "q4"
    keys = frozenset({"group_size", "zero_point"})
    code_bits = 4
    encoder = "moepack.convert.quant.groupq:encode_q4"

    def check(self, codec: dict, shape: tuple[int, ...]) -> None:
        super().check(codec, shape)
        if not isinstance(codec.get("zero_point", False), bool):
            raise bad_codec("codec 'q4': zero_point must be true or false")

    def scale_planes(self, codec: dict) -> int:
        return 2 if codec.get("zero_point") else 1

    def codes(self, codec, buf, rows, cp, ng) -> np.ndarray:
        zp = bool(codec.get("zero_point"))
        packed = buf[2 * rows * ng * (2 if zp else 1) :].reshape(rows, cp // 2)
        nib = np.empty((rows, cp), dtype=np.int16)
        nib[:, 0::2] = packed & 15  # even column in the low nibble
        nib[:, 1::2] = packed >> 4
        return nib if zp else nib - 8

    def minimums(self, codec, buf, rows, ng) -> np.ndarray | None:
        if not codec.get("zero_point"):
            return None
        return buf[2 * rows * ng : 4 * rows * ng].view("<f2").astype(np.float32).reshape(rows, ng)
