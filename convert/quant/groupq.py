"""Group encoders of the trunk codecs q8, q6, q4 (format.codec_group; spec/CODECS.md §2).

Groups of G consecutive weights of a row share an f16 scale (q4 with zero point: also an f16
offset). Quantisation uses the f16-rounded parameters, so codes match what decoders see.
Rounding: np.rint (half to even). Padding columns (cols..cols_p-1) are zero weights.
"""

from __future__ import annotations

import numpy as np
from moepack.convert.quant.refs import EncodeRefs
from moepack.format.codecs import encoded_nbytes

F16_MAX = 65504.0
# q4 symmetric: candidate divisors of the group's signed extreme value m (d = m / c); the one with
# the least squared error wins. c = -8 maps m onto code 0 (value -8·d) and uses all 16 levels.
Q4_DIVISORS = (-8.0, -7.5, -7.0, -6.5, 7.0, 7.5)
# q6: the same search over 64 levels (spec/CODECS.md §2.3); -32 maps m onto code 0.
Q6_DIVISORS = (-32.0, -31.5, -31.0, 31.0, 31.5)


def _groups(w: np.ndarray, g: int) -> tuple[np.ndarray, int]:
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"group codecs need a 2-D weight, got shape {list(w.shape)}")
    rows, cols = w.shape
    cp = -(-cols // g) * g
    wp = np.zeros((rows, cp), np.float32)
    wp[:, :cols] = w
    if not np.all(np.isfinite(wp)):
        raise ValueError("weights are not finite")
    return wp.reshape(rows, cp // g, g), cp


def _f16(x: np.ndarray) -> np.ndarray:
    if np.any(np.abs(x) > F16_MAX):
        raise ValueError("group scale does not fit in f16")
    return x.astype(np.float16)


def _codes(wg: np.ndarray, d: np.ndarray, lo: int, hi: int, offset=0.0) -> np.ndarray:
    """rint((w - offset) / d) clipped to [lo, hi]; 0 where d == 0."""
    d32 = d.astype(np.float32)[..., None]
    safe = np.where(d32 != 0, d32, np.float32(1))
    q = np.rint((wg - offset) / safe)
    return np.where(d32 != 0, np.clip(q, lo, hi), 0)


def encode_q8(codec: dict, w: np.ndarray, refs: EncodeRefs) -> bytes:
    """q8: symmetric int8, d = f16(max|w| / 127)."""
    wg, _ = _groups(w, codec["group_size"])
    d = _f16(np.max(np.abs(wg), axis=2) / np.float32(127))
    q = _codes(wg, d, -127, 127).astype(np.int8)
    return d.astype("<f2").tobytes() + q.tobytes()


def _pack_nibbles(q: np.ndarray) -> bytes:
    rows = q.shape[0]
    flat = q.reshape(rows, -1).astype(np.uint8)
    return (flat[:, 0::2] | (flat[:, 1::2] << 4)).tobytes()  # even column in the low nibble


def _q4_symmetric(wg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = np.argmax(np.abs(wg), axis=2)
    m = np.take_along_axis(wg, idx[..., None], axis=2)[..., 0]
    best_d = best_q = best_err = None
    for c in Q4_DIVISORS:
        d = _f16(m / np.float32(c))
        q = _codes(wg, d, -8, 7)
        err = np.sum(np.square(wg - q * d.astype(np.float32)[..., None]), axis=2)
        if best_err is None:
            best_d, best_q, best_err = d, q, err
            continue
        better = err < best_err  # strict: ties keep the earlier divisor
        best_d = np.where(better, d, best_d)
        best_q = np.where(better[..., None], q, best_q)
        best_err = np.where(better, err, best_err)
    return best_d, best_q + 8


def _q4_zero_point(wg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = np.min(wg, axis=2)
    hi = np.max(wg, axis=2)
    m = _f16(lo)
    d = _f16((hi - m.astype(np.float32)) / np.float32(15))
    q = _codes(wg, d, 0, 15, offset=m.astype(np.float32)[..., None])
    return d, m, q


def encode_q4(codec: dict, w: np.ndarray, refs: EncodeRefs) -> bytes:
    """q4: 4-bit codes; symmetric (d·(q-8)) or with zero point (d·q + m)."""
    wg, _ = _groups(w, codec["group_size"])
    if codec.get("zero_point"):
        d, m, q = _q4_zero_point(wg)
        out = d.astype("<f2").tobytes() + m.astype("<f2").tobytes() + _pack_nibbles(q)
    else:
        d, q = _q4_symmetric(wg)
        out = d.astype("<f2").tobytes() + _pack_nibbles(q)
    assert len(out) == encoded_nbytes(codec, np.shape(w))
    return out


def _pack_q6(k: np.ndarray) -> bytes:
    """Codes 0..63 [rows, cols_p], 4 per 3 bytes: b0 | b1<<8 | b2<<16 = k0 | k1<<6 | ... k3<<18."""
    rows = k.shape[0]
    k = k.reshape(rows, -1, 4).astype(np.uint32)
    u = k[..., 0] | (k[..., 1] << 6) | (k[..., 2] << 12) | (k[..., 3] << 18)
    return np.stack([u & 255, (u >> 8) & 255, u >> 16], axis=-1).astype(np.uint8).tobytes()


def _q6_symmetric(wg: np.ndarray, divisors=Q6_DIVISORS) -> tuple[np.ndarray, np.ndarray]:
    """Best f16 scale among m / t (t in divisors) and its codes 0..63. Squared errors are summed
    in column order by an explicit loop, so the choice (and the bytes) never depend on numpy's
    reduction order."""
    idx = np.argmax(np.abs(wg), axis=2)  # first of equal magnitudes
    m = np.take_along_axis(wg, idx[..., None], axis=2)[..., 0]
    wt = np.ascontiguousarray(np.moveaxis(wg, 2, 0))  # [G][rows][ng]: column j of every group
    best_d = best_q = best_err = None
    for t in divisors:
        d = np.where(m == 0, np.float16(0), _f16(m / np.float32(t)))  # +0, never -0
        d32 = d.astype(np.float32)
        q = np.rint(wt / np.where(d32 != 0, d32, np.float32(1)))
        q = np.where(d32 != 0, np.clip(q, -32, 31), np.float32(0))
        err = np.zeros(d.shape, np.float32)
        for j in range(wt.shape[0]):
            err += np.square(wt[j] - q[j] * d32)
        if best_err is None:
            best_d, best_q, best_err = d, q, err
            continue
        better = err < best_err  # strict: ties keep the earlier divisor
        best_d = np.where(better, d, best_d)
        best_q = np.where(better, q, best_q)
        best_err = np.where(better, err, best_err)
    return best_d, np.moveaxis(best_q + np.float32(32), 0, 2).astype(np.uint8)


def encode_q6(codec: dict, w: np.ndarray, refs: EncodeRefs) -> bytes:
    """q6: symmetric 6-bit codes, w = d·(k - 32); a zero group gets d = 0 and code 32."""
    wg, _ = _groups(w, codec["group_size"])
    d, k = _q6_symmetric(wg)
    out = d.astype("<f2").tobytes() + _pack_q6(k)
    assert len(out) == encoded_nbytes(codec, np.shape(w))
    return out
