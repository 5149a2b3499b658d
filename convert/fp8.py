"""Raw safetensors element types decoded to float32 with numpy (bf16, f16, fp8 e4m3), and
block-scaled fp8 (DeepSeek-V3 / Kimi-K2 style) dequantisation."""

from __future__ import annotations

import numpy as np


def _e4m3_table() -> np.ndarray:
    """float32 value of each fp8 e4m3fn byte (OCP FP8: bias 7, no infinities, S.1111.111 = NaN)."""
    b = np.arange(256, dtype=np.uint32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    val = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * np.exp2(exp.astype(np.float64) - 7))
    val = np.where((exp == 0xF) & ((b & 0x7) == 0x7), np.nan, val)
    return (sign * val).astype(np.float32)


E4M3 = _e4m3_table()


def to_f32(raw: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode little-endian safetensors bytes of `dtype` into a float32 array of `shape`."""
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4").copy()
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F8_E4M3":
        a = E4M3[np.frombuffer(raw, dtype=np.uint8)]
    else:
        raise ValueError(f"not a float dtype: {dtype}")
    return a.reshape(shape)


def dequant_blocks(weight: np.ndarray, scale_inv: np.ndarray,
                   block: tuple[int, int]) -> np.ndarray:
    """`w[r, c] = weight[r, c] * scale_inv[r // b0, c // b1]`; edge blocks may be partial."""
    rows, cols = weight.shape
    full = np.repeat(np.repeat(scale_inv, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return np.ascontiguousarray(weight * full, dtype=np.float32)


def scale_grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """Shape of the `weight_scale_inv` tensor that a 2-D weight of `shape` needs."""
    rows, cols = shape
    return (-(-rows // block[0]), -(-cols // block[1]))
