"""Random-sign Hadamard rotation of the input dimension (spec/CODECS.md §4).

Encoder side: a row w becomes T w with T = H_B D / sqrt(B) per block of B columns (D = diagonal
of ±1 signs). The reference decoder (moepack.format.codecs) applies the inverse D H_B / sqrt(B).
"""

from __future__ import annotations

import numpy as np
from moepack.format.codecs import fwht_, inv_sqrt_block


def pick_block(cols: int, max_block: int) -> int:
    """Largest power of two ≤ max_block that divides cols (1 when cols is odd)."""
    b = 1
    while b * 2 <= max_block and cols % (b * 2) == 0:
        b *= 2
    return b


def make_signs(cols: int, seed: int) -> np.ndarray:
    """Seeded ±1 signs, one per column (stored as the `.rotation` tensor, f32)."""
    rng = np.random.default_rng([seed, 0x5157])  # own stream, independent of sampling
    return np.where(rng.integers(0, 2, cols) == 1, 1.0, -1.0).astype(np.float32)


def rotate_rows(w: np.ndarray, signs: np.ndarray, block: int) -> np.ndarray:
    """T w for every row of w [rows, cols] (f32)."""
    out = np.ascontiguousarray(w * signs, dtype=np.float32)
    fwht_(out, block)
    return out * inv_sqrt_block(block)
