"""Reference of the products of rvq codes with activations, in numpy: the integer lookup-table
matvec of spec/CODECS.md §3.5 (`rvq_matvec`) and the prefill product of §3.6 (`rvq_gemm`).

Bit-exact by construction: every binary32 value the spec names (T, m, inv, d, q, n, acc, y) is
computed as the spec rounds it (§3.6: the integer codebook, the activation's 12-bit integers,
each group's exact sum and the accumulator), so an engine's result can be compared bit for
bit. numpy has no fused multiply-add, so `fma_f32` emulates binary32 fma exactly (see there).
Vectorised over a batch of activations; meant for tests and measurements, not speed.
"""

from __future__ import annotations

import numpy as np
from moepack.format.codecs import RVQ_DIM, fwht_, inv_sqrt_block, rvq_codes

GROUP = 32  # vectors per quantisation group of the tables
QMAX = np.float32(127)
TINY = np.float32(2.0**-96)  # below this a group's tables are all zero


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """binary32 fma(a, b, c) = a·b + c rounded once to nearest even, elementwise (broadcasts).

    a·b of two binary32 values is exact in binary64 (48 significant bits), but the binary64 sum
    with c is rounded, and rounding that again to binary32 can double-round when it lands on a
    binary32 midpoint. TwoSum gives the exact error e of the binary64 sum s; when e ≠ 0, s is
    replaced by its round-to-odd neighbour (of s and the next binary64 towards e, the one with
    an odd significand), which keeps the true value's side of every binary32 midpoint
    (53 ≥ 24 + 2 bits), so the final conversion rounds once, correctly. Infinities and NaN
    follow IEEE (e is then NaN and ignored).
    """
    c64 = np.asarray(c, np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32)
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)  # TwoSum: p + c = s + e exactly (finite s)
        s = np.array(s, np.float64)  # own, writable copy even for 0-d results
        even = (s.view(np.int64) & 1) == 0
        fix = np.isfinite(s) & (e != 0) & even
        s[fix] = np.nextafter(s[fix], np.copysign(np.inf, e[fix]))
        return s.astype(np.float32)


def _steps(m: np.ndarray, qmax: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A group's rounding to integers in -qmax … qmax from its max |value| m (§3.5 and §3.6 step
    2): (live, inv = qmax / m, d = m / qmax), inv and d 0 where the group is not live (m NaN,
    infinite or below 2⁻⁹⁶)."""
    live = np.isfinite(m) & (m >= TINY)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(live, qmax / m, np.float32(0)).astype(np.float32)
        d = np.where(live, m / qmax, np.float32(0)).astype(np.float32)
    return live, inv, d


def tables(xv: np.ndarray, cb: np.ndarray) -> np.ndarray:
    """§3.5 step 1: T[..., v, t, e] = x·cb[t][e] by a product and an fma chain (binary32).

    xv: activations as vectors [..., nv, 8] (f32); cb: [S, 256, 8] (f32).
    """
    x = xv[..., :, None, None, :]  # [..., nv, 1, 1, 8]
    t = x[..., 0] * cb[..., 0]
    for d in range(1, RVQ_DIM):  # dimension order is part of the numerics
        t = fma_f32(x[..., d], cb[..., d], t)
    return t  # [..., nv, S, 256]


def quantise(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """§3.5 step 2: (q int8 [..., nv, S, 256], d f32 [..., ng, S], nan [...] bool).

    nan marks the activations whose product is NaN (some group's max |T| is NaN or +inf).
    """
    *lead, nv, s, k = t.shape
    ng = -(-nv // GROUP)
    pad = np.zeros((*lead, ng * GROUP - nv, s, k), np.float32)  # zero vectors do not raise m
    groups = np.concatenate([np.abs(t), pad], axis=-3).reshape(*lead, ng, GROUP, s, k)
    m = groups.max(axis=(-3, -1))  # [..., ng, S]; max propagates NaN
    nan = ~np.isfinite(m).all(axis=(-2, -1))
    live, inv, d = _steps(m, QMAX)
    with np.errstate(invalid="ignore", over="ignore"):
        inv_v = np.repeat(inv, GROUP, axis=-2)[..., :nv, :, None]  # per vector [..., nv, S, 1]
        q = np.rint((t * inv_v).astype(np.float32))  # product rounded to f32, then to even
    q = np.where(np.isfinite(q), q, 0).astype(np.int8)  # rows of NaN products are NaN anyway
    return q, d, nan


def sums(q: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """§3.5 step 3: n[..., r, g, t] = Σ over the group's vectors of q[v][t][code] (exact, int32)."""
    nv, s = codes.shape[1], codes.shape[2]
    ng = -(-nv // GROUP)
    idx = codes.astype(np.intp)[..., None]
    idx = idx.reshape((1,) * (q.ndim - 3) + idx.shape)  # broadcast over the batch
    picked = np.take_along_axis(q[..., None, :, :, :], idx, axis=-1)[..., 0]
    picked = picked.astype(np.int32)  # [..., rows, nv, S]
    pad = np.zeros((*picked.shape[:-2], ng * GROUP - nv, s), np.int32)
    full = np.concatenate([picked, pad], axis=-2)
    return full.reshape(*picked.shape[:-2], ng, GROUP, s).sum(axis=-2)


QUIET_NAN = np.array([0x7FC00000], np.uint32).view(np.float32)[0]


def combine(n: np.ndarray, d: np.ndarray, scales: np.ndarray, nan: np.ndarray) -> np.ndarray:
    """§3.5 step 4: acc = fma(f32(n), d, acc) over g, then t within g; y = acc × s_r."""
    acc = np.zeros(n.shape[:-2], np.float32)  # [..., rows]
    for g in range(n.shape[-2]):
        for t in range(n.shape[-1]):
            acc = fma_f32(n[..., g, t].astype(np.float32), d[..., None, g, t], acc)
    y = acc * scales
    y[nan] = np.nan
    y[np.isnan(y)] = QUIET_NAN  # one NaN bit pattern for every NaN row (CODECS.md §3.5)
    return y


def rotate_activation(x: np.ndarray, signs: np.ndarray, block: int) -> np.ndarray:
    """§3.2: x̃ = κ · FWHT(σ ⊙ x) per block, with §3.1's butterfly (binary32)."""
    xt = np.ascontiguousarray(np.asarray(x, np.float32) * np.asarray(signs, np.float32))
    return fwht_(xt, block) * inv_sqrt_block(block)


def rvq_matvec(codec: dict, shape, data, codebook: np.ndarray, x: np.ndarray,
               rotation: np.ndarray | None = None) -> np.ndarray:
    """y = the §3.5 product of one rvq projection (bytes `data`, `shape` [rows, cols]) with x.

    x: [..., cols] binary32 activations (before the rotation; it is applied here when the codec
    has one). Returns [..., rows] binary32, bit-identical to a conforming engine.
    """
    codes, scales, xv = _prepared(codec, shape, data, x, rotation)
    q, d, nan = quantise(tables(xv, np.asarray(codebook, np.float32)))
    return combine(sums(q, codes), d, scales, nan)


def _prepared(codec: dict, shape, data, x: np.ndarray, rotation: np.ndarray | None):
    """(codes [rows, nv, S], scales [rows], x rotated and zero-padded to [..., nv, 8])"""
    rows, cols = shape
    codes, scales = rvq_codes(codec, shape, data)
    x = np.asarray(x, np.float32)
    if x.shape[-1] != cols:
        raise ValueError(f"activation has {x.shape[-1]} values, the projection {cols} columns")
    if codec.get("rotation", "none") == "hadamard":
        if rotation is None:
            raise ValueError("codec 'rvq': rotation 'hadamard' needs the layer's rotation signs")
        x = rotate_activation(x, rotation, codec["rotation_block"])
    nv = codes.shape[1]
    xp = np.zeros((*x.shape[:-1], nv * RVQ_DIM), np.float32)
    xp[..., :cols] = x  # padding columns are 0
    return codes, scales, xp.reshape(*x.shape[:-1], nv, RVQ_DIM)


XGROUP = 64  # §3.6: vectors per group of an activation's 12-bit integers (512 columns)
XMAX = np.float32(2047)
WMAX = 16383  # §3.6: a decoded weight is an integer of at most 15 bits


def int_codebook(cb: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """§3.6 step 1: (cbq int64 [S, 256, 8], p, nan): cbq = round(cb × 2^p), the largest p ≤ 100
    with (Σ_t max |cb[t]|) × 2^p ≤ 16383 − S (binary64, stage order); nan when an entry is not
    finite (every product row is then NaN)."""
    cb = np.asarray(cb, np.float32)
    if not np.isfinite(cb).all():
        return np.zeros(cb.shape, np.int64), 0, True
    total = 0.0
    for t in range(cb.shape[0]):
        total += float(np.abs(cb[t]).max())
    p = 0
    if total > 0:
        frac, e = np.frexp(total)  # total = frac · 2^e, 0.5 <= frac < 1
        bound = WMAX - cb.shape[0]
        p = 14 - int(e) if frac * 16384.0 <= bound else 13 - int(e)
        p = min(p, 100)
    q = np.rint(cb.astype(np.float64) * 2.0**p).astype(np.int64)
    return q, p, False


def int_activation(xv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§3.6 step 2: (q int64 [..., ng·XGROUP, 8] zero-padded, d f32 [..., ng]) of x [..., nv, 8]."""
    *lead, nv, _ = xv.shape
    ng = -(-nv // XGROUP)
    xp = np.zeros((*lead, ng * XGROUP, RVQ_DIM), np.float32)
    xp[..., :nv, :] = xv
    g = xp.reshape(*lead, ng, XGROUP * RVQ_DIM)
    m = np.abs(g).max(axis=-1)  # max propagates NaN
    live, inv, d = _steps(m, XMAX)
    d = np.where(np.isfinite(m), d, np.float32(np.nan))  # a NaN or infinite group: NaN rows
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint((g * inv[..., None]).astype(np.float32))
    q = np.where(live[..., None], q, 0).astype(np.int64)
    return q.reshape(*lead, ng * XGROUP, RVQ_DIM), d.astype(np.float32)


def rvq_gemm(codec: dict, shape, data, codebook: np.ndarray, x: np.ndarray,
             rotation: np.ndarray | None = None) -> np.ndarray:
    """y = the §3.6 prefill product (integer weights times 12-bit activations) with x [..., cols].

    Same arguments and result shape as rvq_matvec; bit-identical to a conforming engine.
    """
    codes, scales, xv = _prepared(codec, shape, data, x, rotation)
    cbq, p, nan = int_codebook(codebook)
    rows, nv, _ = codes.shape
    w = cbq[0][codes[..., 0]]  # [rows, nv, 8]: exact integer sums
    for t in range(1, codes.shape[-1]):
        w = w + cbq[t][codes[..., t]]
    q, d = int_activation(xv)
    ng = d.shape[-1]
    wp = np.zeros((rows, ng * XGROUP, RVQ_DIM), np.int64)
    wp[:, :nv] = w
    wg = wp.reshape(rows, ng, XGROUP * RVQ_DIM)
    qg = q.reshape(*q.shape[:-2], ng, XGROUP * RVQ_DIM)
    n = np.einsum("rgc,...gc->...rg", wg, qg)  # one exact sum per group, |n| < 2^35
    a = np.zeros((*q.shape[:-2], rows), np.float32)
    for g in range(ng):  # the group order is part of the numerics
        a = fma_f32(n[..., g].astype(np.float32), d[..., None, g], a)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (a * scales) * np.float32(2.0**-p)
    if nan:
        y[...] = np.nan
    y[np.isnan(y)] = QUIET_NAN
    return y
