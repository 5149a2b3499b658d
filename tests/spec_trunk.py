"""The trunk's grouped products as the engine computes them (CODECS.md §2.4): each activation
rounded to 16-bit integers per group of the weights' columns (moepack.format.group_gemm's step
1), then multiplied with the decoded weights. What is left against the engine is its binary32
arithmetic, which can send an activation's rounding the other way (tests/test_k3_engine.py)."""

from __future__ import annotations

import numpy as np
from moepack.format.group_gemm import int_activation

GROUP = 32  # the converter's default trunk codecs (q6 and q8, groups of 32 columns)


def rounded(x: np.ndarray, group: int = GROUP) -> np.ndarray:
    """§2.4 step 1 on the last axis of x, returned as the values q x dx (float64)."""
    x = np.asarray(x)
    q, d = int_activation(x, group)
    out = q.astype(np.float64) * d.astype(np.float64)[..., None]
    return out.reshape(*q.shape[:-2], -1)[..., : x.shape[-1]]


class SpecTrunk:
    """A trunk matrix whose products (`matrix @ x`, x one activation) round x as §2.4."""

    def __init__(self, w: np.ndarray) -> None:
        self.w = w

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return self.w @ rounded(x)
