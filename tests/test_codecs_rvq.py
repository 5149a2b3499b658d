"""RVQ expert codec: training, encoding, decoding, odd shapes, rotation, reproducibility."""

import os
import subprocess
import sys

import numpy as np
import pytest
from moepack.convert.quant import RvqSettings, codec_for, encode, expert_settings, train_layer
from moepack.convert.quant.rotation import make_signs, pick_block, rotate_rows
from moepack.format.codecs import decode, encoded_nbytes

RNG = np.random.default_rng(11)
FAST = RvqSettings(stages=3, iters=4, sample=20_000)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def experts(count: int, shape: tuple[int, int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def round_trip(ws: list[np.ndarray], settings: RvqSettings, seed: int = 3):
    shape = ws[0].shape
    codec, cb, signs = train_layer(lambda e: ws[e], len(ws), shape, settings, seed)
    blobs = [encode(codec, w, codebook=cb, rotation=signs, settings=settings) for w in ws]
    outs = [decode(codec, shape, b, codebook=cb, rotation=signs) for b in blobs]
    return codec, cb, signs, blobs, outs


@pytest.mark.parametrize("cols", [8, 13, 100, 96])
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_round_trip_odd_shapes(cols: int, rotation: str) -> None:
    ws = experts(3, (40, cols))
    st = RvqSettings(stages=3, iters=4, sample=20_000, rotation=rotation, scale="rms",
                     refit_scale=True, beam=2)
    codec, cb, signs, blobs, outs = round_trip(ws, st)
    assert cb.shape == (3, 256, 8) and cb.dtype == np.float32
    if rotation == "hadamard" and cols % 2 == 0:
        assert codec["rotation_block"] == pick_block(cols, 256) and signs.shape == (cols,)
    else:
        assert codec["rotation"] == "none" and signs is None
    for w, b, out in zip(ws, blobs, outs, strict=True):
        assert len(b) == encoded_nbytes(codec, w.shape)
        assert out.shape == w.shape
        assert rel_err(out, w) < 0.3


def test_layout_64_row_tiles_then_scales() -> None:
    """CODECS.md §3: codes[i][v·S + t][l] is stage t of vector v of row 64·i + l; padding rows
    are code 0; the f16 scales follow at R·J. Decode is checked against that index formula."""
    rows, cols, s = 70, 13, 3  # two tiles, 58 padding rows; nv = 2 with a partial vector
    ws = experts(2, (rows, cols))
    codec, cb, _, blobs, outs = round_trip(ws, FAST)
    raw = np.frombuffer(blobs[0], np.uint8)
    nv, j, r_pad = 2, 2 * s, 128
    assert raw.size == encoded_nbytes(codec, (rows, cols)) == r_pad * j + 2 * rows
    tiles = raw[: r_pad * j].reshape(2, j, 64)
    assert not tiles[1, :, rows - 64 :].any()  # padding rows of the last tile
    scales = raw[r_pad * j :].view("<f2").astype(np.float32)
    want = np.zeros((rows, nv * 8), np.float32)
    for r in range(rows):
        for v in range(nv):
            acc = cb[0][tiles[r // 64, v * s, r % 64]]
            for t in range(1, s):
                acc = acc + cb[t][tiles[r // 64, v * s + t, r % 64]]
            want[r, 8 * v : 8 * v + 8] = acc * scales[r]
    assert np.array_equal(outs[0], want[:, :cols])


def test_size_rule_example() -> None:
    """The worked example of CODECS.md §3: rows 100, cols 20, S 2 -> 768 + 200 bytes."""
    codec = {"name": "rvq", "stages": 2, "dim": 8, "entries": 256}
    assert encoded_nbytes(codec, (100, 20)) == 968
    assert encoded_nbytes(codec, (64, 8)) == 64 * 2 + 128  # a full tile has no padding rows


def test_zero_expert_decodes_to_zero() -> None:
    ws = experts(2, (8, 16)) + [np.zeros((8, 16), np.float32)]
    *_, outs = round_trip(ws, FAST)
    assert not outs[2].any()


def test_default_beats_baseline_on_gaussian() -> None:
    ws = experts(4, (64, 256), seed=5)
    small = {"iters": 6, "sample": 30_000}
    base = RvqSettings(**{**vars(expert_settings("rvq3-baseline")), **small})
    best = RvqSettings(**{**vars(expert_settings("rvq3")), **small})
    e_base = np.mean([rel_err(o, w) for o, w in zip(round_trip(ws, base)[-1], ws, strict=True)])
    e_best = np.mean([rel_err(o, w) for o, w in zip(round_trip(ws, best)[-1], ws, strict=True)])
    assert e_best < e_base


def test_more_stages_less_error() -> None:
    ws = experts(2, (32, 64))
    errs = []
    for s in (1, 2, 3):
        *_, outs = round_trip(ws, RvqSettings(stages=s, iters=4, sample=20_000))
        errs.append(np.mean([rel_err(o, w) for o, w in zip(outs, ws, strict=True)]))
    assert errs[0] > errs[1] > errs[2]


def test_rotation_inverse_is_exact_up_to_rounding() -> None:
    cols = 64
    w = RNG.standard_normal((6, cols)).astype(np.float32)
    signs = make_signs(cols, 1)
    assert set(np.unique(signs)) == {-1.0, 1.0}
    rot = rotate_rows(w, signs, 32)
    # an f32 codec of the rotated rows stands in for "perfect codes": decode must undo T
    from moepack.format.codecs import fwht_, inv_sqrt_block

    back = fwht_(rot.copy(), 32) * inv_sqrt_block(32) * signs
    assert np.allclose(back, w, atol=1e-5)


def test_same_bytes_for_any_thread_count() -> None:
    ws = experts(3, (48, 40), seed=9)
    st = RvqSettings(stages=3, iters=3, sample=20_000, beam=4, refine=1, rotation="hadamard",
                     scale="rms", refit_scale=True)
    res = []
    for threads in (1, 2):
        codec, cb, signs = train_layer(lambda e: ws[e], 3, (48, 40), st, 5, threads=threads)
        blobs = [encode(codec, w, codebook=cb, rotation=signs, settings=st, threads=threads)
                 for w in ws]
        res.append((cb.tobytes(), signs.tobytes(), blobs))
    assert res[0] == res[1]


SCRIPT = """
import hashlib, numpy as np
from moepack.convert.quant import RvqSettings, encode, train_layer
rng = np.random.default_rng(2)
ws = [rng.standard_normal((32, 24)).astype(np.float32) for _ in range(2)]
st = RvqSettings(iters=3, sample=20000, beam=2, refine=1, scale="rms", refit_scale=True)
codec, cb, signs = train_layer(lambda e: ws[e], 2, (32, 24), st, 1)
h = hashlib.sha256(cb.tobytes())
for w in ws:
    h.update(encode(codec, w, codebook=cb, rotation=signs, settings=st))
print(h.hexdigest())
"""


def test_same_bytes_under_different_numpy_thread_settings() -> None:
    digests = set()
    for n in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                             text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_codec_for_falls_back_without_even_columns() -> None:
    st = RvqSettings(rotation="hadamard")
    assert codec_for(st, (4, 13))["rotation"] == "none"
    assert codec_for(st, (4, 384))["rotation_block"] == 128
    assert codec_for(st, (4, 4096))["rotation_block"] == 256


def test_rvq_rejects_non_finite_and_bad_codebook() -> None:
    ws = experts(2, (8, 16))
    codec, cb, signs = train_layer(lambda e: ws[e], 2, (8, 16), FAST, 1)
    bad = ws[0].copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="finite"):
        encode(codec, bad, codebook=cb, settings=FAST)
    with pytest.raises(ValueError, match="codebook"):
        encode(codec, ws[0], codebook=cb[:2], settings=FAST)
    with pytest.raises(ValueError, match="codebook"):
        encode(codec, ws[0], settings=FAST)


def test_decode_rejects_bad_rotation_and_codebook() -> None:
    from moepack.format import FormatError

    ws = experts(2, (8, 16))
    st = RvqSettings(iters=2, sample=5_000, rotation="hadamard")
    codec, cb, signs = train_layer(lambda e: ws[e], 2, (8, 16), st, 1)
    data = encode(codec, ws[0], codebook=cb, rotation=signs, settings=st)
    with pytest.raises(FormatError, match="signs"):
        decode(codec, (8, 16), data, codebook=cb, rotation=signs * 0.5)
    with pytest.raises(FormatError, match="rotation tensor"):
        decode(codec, (8, 16), data, codebook=cb)
    with pytest.raises(FormatError, match="codebook shape"):
        decode(codec, (8, 16), data, codebook=cb[:, :128], rotation=signs)
    with pytest.raises(FormatError, match="needs the layer's codebook"):
        decode(codec, (8, 16), data, rotation=signs)
