"""Reference of the trunk's integer product (spec/CODECS.md §2.4) in numpy: a group codec's
integer codes summed exactly against activations rounded to 16-bit integers per group, the
scales (and q4 minimums) applied once per group with binary32 fma.

Bit-exact by construction, like moepack.format.rvq_matvec: every binary32 value the spec names
(m, inv, dx, qx, n, z, the scale products, a) is computed as the spec rounds it, so an engine's
result can be compared bit for bit. Vectorised over a batch of activations; for tests and
measurements, not speed.
"""

from __future__ import annotations

import numpy as np
from moepack.format.codec_base import align_up
from moepack.format.codecs import codec_class
from moepack.format.rvq_matvec import QUIET_NAN, _steps, fma_f32

XMAX = np.float32(32767)


def int_activation(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """§2.4 step 1: (q int64 [..., ng, group] zero-padded, dx f32 [..., ng]) of x [..., cols]."""
    x = np.asarray(x, np.float32)
    *lead, cols = x.shape
    ng = -(-cols // group)
    xp = np.zeros((*lead, ng * group), np.float32)
    xp[..., :cols] = x
    g = xp.reshape(*lead, ng, group)
    m = np.abs(g).max(axis=-1)  # max propagates NaN
    live, inv, d = _steps(m, XMAX)
    d = np.where(np.isfinite(m), d, np.float32(np.nan))  # a NaN or infinite group: NaN rows
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint((g * inv[..., None]).astype(np.float32))
    return np.where(live[..., None], q, 0).astype(np.int64), d.astype(np.float32)


def group_gemm(codec: dict, shape, data, x: np.ndarray) -> np.ndarray:
    """y [..., rows] = the §2.4 product of a q8 / q6 / q4 matrix (codec, shape, its encoded
    bytes) with activations x [..., cols]; bit-identical to a conforming engine."""
    rows, cols = shape
    group = codec["group_size"]
    cp = align_up(cols, group)
    ng = cp // group
    c = codec_class(codec)
    buf = np.frombuffer(data, np.uint8)
    k = c.codes(codec, buf, rows, cp, ng).astype(np.int64).reshape(rows, ng, group)
    scales = buf[: 2 * rows * ng].view("<f2").astype(np.float32).reshape(rows, ng)
    mins = c.minimums(codec, buf, rows, ng)
    q, d = int_activation(x, group)
    n = np.einsum("rgc,...gc->...rg", k, q)  # exact: |n| < 2^31
    z = q.sum(axis=-1).astype(np.float32)  # exact: |z| < 2^24
    a = np.zeros((*q.shape[:-2], rows), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for g in range(ng):  # the group order is part of the numerics
            a = fma_f32(n[..., g].astype(np.float32), scales[:, g] * d[..., None, g], a)
            if mins is not None:
                a = fma_f32(z[..., None, g], mins[:, g] * d[..., None, g], a)
    a[np.isnan(a)] = QUIET_NAN
    return a
