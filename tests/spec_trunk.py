"""The trunk's prompt product as the engine computes it (CODECS.md §2.4): each activation rounded
to 16-bit integers per group of the weights' columns, then multiplied with the decoded weights.
What is left against the engine is the combine's binary32 rounding (~1e-7 relative)."""

from __future__ import annotations

import numpy as np

GROUP = 32  # the converter's default trunk codecs (q6 and q8, groups of 32 columns)
_TINY = np.float32(2.0 ** -96)


def rounded(x: np.ndarray, group: int = GROUP) -> np.ndarray:
    """§2.4 step 1 on the last axis of x, returned as the values q x dx (float64)."""
    x32 = np.asarray(x, np.float32)
    cols = x32.shape[-1]
    ng = -(-cols // group)
    pad = np.zeros(x32.shape[:-1] + (ng * group,), np.float32)
    pad[..., :cols] = x32
    g = pad.reshape(x32.shape[:-1] + (ng, group))
    m = np.abs(g).max(-1)
    live = np.isfinite(m) & (m >= _TINY)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(live, np.float32(32767) / np.where(live, m, 1), 0).astype(np.float32)
        d = np.where(live, m / np.float32(32767), 0).astype(np.float32)
        q = np.rint((g * inv[..., None]).astype(np.float32))
    out = q.astype(np.float64) * d.astype(np.float64)[..., None]
    return out.reshape(pad.shape)[..., :cols]


class SpecTrunk:
    """A trunk matrix whose products (`matrix @ x`, x one activation) round x as §2.4."""

    def __init__(self, w: np.ndarray) -> None:
        self.w = w

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return self.w @ rounded(x)
