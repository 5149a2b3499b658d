"""Float codecs f32, f16, bf16: the values themselves, little-endian (spec/FORMAT.md §8.1)."""

from __future__ import annotations

from math import prod

import numpy as np
from moepack.format.codec_base import Codec


class F32(Codec):
    name = "f32"
    matrix = False
    encoder = "moepack.convert.quant.dense:encode_codec"

    def nbytes(self, codec: dict, shape: tuple[int, ...]) -> int:
        return prod(shape) * 4

    def decode(self, codec, shape, buf, codebook, rotation) -> np.ndarray:
        return buf.view("<f4").astype(np.float32).reshape(shape)


class F16(F32):
    name = "f16"

    def nbytes(self, codec: dict, shape: tuple[int, ...]) -> int:
        return prod(shape) * 2

    def decode(self, codec, shape, buf, codebook, rotation) -> np.ndarray:
        return buf.view("<f2").astype(np.float32).reshape(shape)


class BF16(F16):
    name = "bf16"

    def decode(self, codec, shape, buf, codebook, rotation) -> np.ndarray:
        return (buf.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
