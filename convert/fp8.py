"""Block-scaled fp8 e4m3 weights (DeepSeek-V3 / Kimi-K2 style) dequantised to float32."""

from __future__ import annotations

import numpy as np
import torch


def dequant_blocks(weight: torch.Tensor, scale_inv: torch.Tensor,
                   block: tuple[int, int]) -> np.ndarray:
    """`w[r, c] = f32(weight[r, c]) * scale_inv[r // b0, c // b1]`; edge blocks may be partial."""
    rows, cols = weight.shape
    b0, b1 = block
    scale = scale_inv.to(torch.float32)
    # Expand the block grid to element resolution, then crop the partial edge blocks.
    full = scale.repeat_interleave(b0, dim=0).repeat_interleave(b1, dim=1)[:rows, :cols]
    return (weight.to(torch.float32) * full).numpy()


def scale_grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    """Shape of the `weight_scale_inv` tensor that a 2-D weight of `shape` needs."""
    rows, cols = shape
    return (-(-rows // block[0]), -(-cols // block[1]))
