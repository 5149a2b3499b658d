"""The numpy reference of CODECS.md §3.5 (format/rvq_matvec.py): exact binary32 fma, the steps
against a scalar transcription of the spec, the special cases, and the size of the table error."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
from moepack.convert.quant import RvqSettings, encode, train_layer
from moepack.format.codecs import decode, encoded_nbytes, rvq_codes
from moepack.format.rvq_matvec import fma_f32, rvq_matvec

RNG = np.random.default_rng(21)
_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.fmaf.restype = ctypes.c_float
_libm.fmaf.argtypes = [ctypes.c_float] * 3


def c_fmaf(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = [_libm.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c, strict=True)]
    return np.array(out, np.float32)


def near_midpoints(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a·b = ±half an ulp of c × (1 ± 2^-2k): the sum lies a hair off a binary32 midpoint, below
    binary64 precision, where rounding through binary64 goes the wrong way half the time."""
    k = RNG.integers(13, 24, n)
    c = (RNG.choice([-1.0, 1.0], n) * (1 + RNG.integers(0, 2**23, n) * 2.0**-23)
         * np.exp2(RNG.integers(-100, 127, n))).astype(np.float32)
    half = np.spacing(np.abs(c)).astype(np.float64) / 2
    a = (half * (1 + 2.0**-k)).astype(np.float32)
    b = (RNG.choice([-1.0, 1.0], n) * (1 - 2.0**-k)).astype(np.float32)
    return a, b, c


def specials() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Overflow, subnormal results, signed zeros, infinities and NaN."""
    big, tiny = np.float32(3e38), np.float32(1e-30)
    vals = [(big, 2, -big), (big, 2, 0), (big, -2, big), (tiny, tiny, 0), (tiny, tiny, 1e-45),
            (-0.0, 1, -0.0), (0.0, -1, -0.0), (1, 1, -1), (np.inf, 0, 1), (np.inf, 1, -np.inf),
            (np.nan, 1, 1), (1, 1, np.inf), (1.5, 2**-149, 2**-149), (2**-75, 2**-75, -2**-149)]
    a, b, c = (np.array(v, np.float32) for v in zip(*vals, strict=True))
    return a, b, c


def gaussian() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b, c = RNG.standard_normal((3, 5000)).astype(np.float32)
    return a, b, c


@pytest.mark.parametrize("cases", [lambda: near_midpoints(5000), specials, gaussian])
def test_fma_f32_matches_c_fmaf_bit_for_bit(cases) -> None:
    a, b, c = cases()
    want = c_fmaf(a, b, c)
    got = fma_f32(a, b, c)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), (a[~same][:3], b[~same][:3], c[~same][:3])


def test_near_midpoint_cases_defeat_plain_double_rounding() -> None:
    """The adversarial cases are real: rounding a·b + c through binary64 errs on many of them."""
    a, b, c = near_midpoints(2000)
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (naive != c_fmaf(a, b, c)).sum() > 500


def scalar_matvec(cb: np.ndarray, codes: np.ndarray, scales: np.ndarray, x: np.ndarray):
    """§3.5 transcribed one value at a time with C's fmaf and numpy binary32 scalars."""
    f32 = np.float32
    rows, nv, s = codes.shape
    xp = np.zeros(nv * 8, np.float32)
    xp[: x.size] = x
    T = np.zeros((nv, s, 256), np.float32)
    for v in range(nv):
        for t in range(s):
            for e in range(256):
                acc = f32(xp[8 * v] * cb[t, e, 0])
                for d in range(1, 8):
                    acc = f32(_libm.fmaf(float(xp[8 * v + d]), float(cb[t, e, d]), float(acc)))
                T[v, t, e] = acc
    ng = -(-nv // 32)
    q = np.zeros((nv, s, 256), np.int64)
    dd = np.zeros((ng, s), np.float32)
    for g in range(ng):
        for t in range(s):
            m = f32(np.abs(T[32 * g : 32 * g + 32, t]).max())
            if m < f32(2.0**-96):
                continue
            inv, dd[g, t] = f32(f32(127) / m), f32(m / f32(127))
            q[32 * g : 32 * g + 32, t] = np.rint(T[32 * g : 32 * g + 32, t] * inv)
    y = np.zeros(rows, np.float32)
    for r in range(rows):
        acc = f32(0)
        for g in range(ng):
            for t in range(s):
                n = sum(int(q[v, t, codes[r, v, t]]) for v in range(32 * g, min(32 * g + 32, nv)))
                acc = f32(_libm.fmaf(float(n), float(dd[g, t]), float(acc)))
        y[r] = f32(acc * scales[r])
    return y


def random_projection(shape: tuple[int, int], stages: int, seed: int = 0):
    """A codec, random tiled bytes (every code, mixed-sign scales) and a codebook."""
    rng = np.random.default_rng(seed)
    codec = {"name": "rvq", "stages": stages, "dim": 8, "entries": 256, "rotation": "none"}
    data = rng.integers(0, 256, encoded_nbytes(codec, shape), dtype=np.uint8)
    scales = data[data.size - 2 * shape[0] :].view("<f2")
    scales[:] = (rng.standard_normal(shape[0]) * 0.1).astype(np.float16)
    scales[0] = np.float16(6e-8)  # an f16 subnormal scale
    cb = (rng.standard_normal((stages, 256, 8)) * rng.choice([1e-3, 1.0, 40.0], stages)[:, None,
          None]).astype(np.float32)
    return codec, data.tobytes(), cb


@pytest.mark.parametrize("shape, stages", [((5, 20), 2), ((70, 300), 1), ((3, 264), 3)])
def test_reference_equals_scalar_transcription(shape: tuple[int, int], stages: int) -> None:
    """Vectorised reference == the spec step by step (one and several groups of 32 vectors,
    a partial last group and vector, two code tiles)."""
    codec, data, cb = random_projection(shape, stages)
    codes, scales = rvq_codes(codec, shape, data)
    x = (RNG.standard_normal(shape[1]) * 3).astype(np.float32)
    x[::7] *= np.float32(1e-3)
    want = scalar_matvec(cb, codes, scales, x)
    got = rvq_matvec(codec, shape, data, cb, x)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_batch_gives_the_same_bits_as_one_by_one() -> None:
    codec, data, cb = random_projection((70, 40), 2, seed=1)
    xs = RNG.standard_normal((4, 40)).astype(np.float32)
    batch = rvq_matvec(codec, (70, 40), data, cb, xs)
    for i in range(4):
        assert np.array_equal(batch[i].view(np.uint32),
                              rvq_matvec(codec, (70, 40), data, cb, xs[i]).view(np.uint32))


def test_special_activations() -> None:
    codec, data, cb = random_projection((6, 24), 2, seed=2)
    zero = rvq_matvec(codec, (6, 24), data, cb, np.zeros(24, np.float32))
    assert np.all(zero == 0)  # m = 0: d = 0, every q = 0
    tiny = rvq_matvec(codec, (6, 24), data, cb, np.full(24, 1e-38, np.float32))
    assert np.all(tiny == 0)  # m < 2^-96
    for bad in (np.nan, np.inf):
        x = np.ones(24, np.float32)
        x[5] = bad
        assert np.all(np.isnan(rvq_matvec(codec, (6, 24), data, cb, x)))


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_close_to_the_decoded_product(rotation: str) -> None:
    """The int8 tables cost about 1 % relative error against Ŵx (docs/QUANTIZATION.md)."""
    shape = (96, 256)
    ws = [RNG.standard_normal(shape).astype(np.float32) for _ in range(2)]
    st = RvqSettings(iters=3, sample=20_000, rotation=rotation)
    codec, cb, signs = train_layer(lambda e: ws[e], 2, shape, st, 4)
    data = encode(codec, ws[0], codebook=cb, rotation=signs, settings=st)
    w_hat = decode(codec, shape, data, codebook=cb, rotation=signs).astype(np.float64)
    x = RNG.standard_normal((8, shape[1])).astype(np.float32)
    y = rvq_matvec(codec, shape, data, cb, x, signs).astype(np.float64)
    exact = x @ w_hat.T
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert 1e-3 < rel < 0.03, rel
