"""The C codec loops agree with the Python reference: decoders bit for bit, search semantics."""

import numpy as np
import pytest
from moepack.convert.quant import TRUNK_CODECS, RvqSettings, encode, native, train_layer
from moepack.format.codecs import decode, fwht_

RNG = np.random.default_rng(5)


def c_decode(codec: dict, shape: tuple[int, int], data: bytes, cb=None, signs=None) -> np.ndarray:
    rows, cols = shape
    out = np.empty(shape, np.float32)
    raw = np.frombuffer(data, np.uint8).copy()
    lib = native.lib()
    if codec["name"] == "q8":
        rc = lib.mp_q8_decode(raw, rows, cols, codec["group_size"], out)
    elif codec["name"] == "q4":
        rc = lib.mp_q4_decode(raw, rows, cols, codec["group_size"], int(codec["zero_point"]), out)
    elif codec["name"] == "q6":
        rc = lib.mp_q6_decode(raw, rows, cols, codec["group_size"], out)
    else:
        n = -(-rows // 64) * 64 * -(-cols // 8) * codec["stages"]  # the 64-row code tiles
        scales = raw[len(raw) - 2 * rows :].view(np.uint16).copy()
        block = codec.get("rotation_block", 0)
        sp = signs.ctypes.data if signs is not None else None
        rc = lib.mp_rvq_decode(raw[:n].copy(), scales, rows, cols, cb, codec["stages"], 256, sp,
                               block, out)
    assert rc == 0
    return out


@pytest.mark.parametrize("name", ["q8", "q4", "q4-zp"])
@pytest.mark.parametrize("shape", [(5, 70), (3, 256), (1, 7)])
def test_group_decode_bit_identical(name: str, shape: tuple[int, int]) -> None:
    codec = TRUNK_CODECS[name]
    w = (RNG.standard_t(3, shape) * 0.05).astype(np.float32)
    data = encode(codec, w)
    assert decode(codec, shape, data).tobytes() == c_decode(codec, shape, data).tobytes()


@pytest.mark.parametrize("g", [16, 32, 256])
@pytest.mark.parametrize("shape", [(5, 70), (3, 256), (1, 7), (4, 300)])
def test_q6_decode_bit_identical(g: int, shape: tuple[int, int]) -> None:
    codec = {"name": "q6", "group_size": g}
    w = (RNG.standard_t(3, shape) * 0.05).astype(np.float32)
    data = encode(codec, w)
    assert decode(codec, shape, data).tobytes() == c_decode(codec, shape, data).tobytes()


@pytest.mark.parametrize("g", [16, 64])
def test_q6_decode_random_bytes_bit_identical(g: int) -> None:
    """Any bytes (every code, f16 subnormal / inf / NaN scales, junk in padding columns)."""
    from moepack.format.codecs import encoded_nbytes

    codec, shape = {"name": "q6", "group_size": g}, (11, 45)
    data = RNG.integers(0, 256, encoded_nbytes(codec, shape), dtype=np.uint8)
    scales = data[: 2 * 11 * -(-45 // g)].view(np.uint16)
    scales[:5] = [0x0001, 0x83FF, 0x7C00, 0xFC00, 0x7E01]
    py = decode(codec, shape, data.tobytes())
    c = c_decode(codec, shape, data.tobytes())
    assert np.array_equal(py.view(np.uint32), c.view(np.uint32))


def test_q6_decode_rejects_bad_group() -> None:
    out = np.empty((1, 8), np.float32)
    assert native.lib().mp_q6_decode(np.zeros(64, np.uint8), 1, 8, 0, out) == -1
    assert native.lib().mp_q6_decode(np.zeros(64, np.uint8), 1, 8, 6, out) == -1


@pytest.mark.parametrize("rotation, cols", [("none", 13), ("none", 64), ("hadamard", 20),
                                            ("hadamard", 96), ("hadamard", 128)])
def test_rvq_decode_bit_identical(rotation: str, cols: int) -> None:
    ws = [RNG.standard_normal((24, cols)).astype(np.float32) for _ in range(2)]
    st = RvqSettings(iters=3, sample=10_000, rotation=rotation, max_block=64)
    codec, cb, signs = train_layer(lambda e: ws[e], 2, (24, cols), st, 4)
    data = encode(codec, ws[0], codebook=cb, rotation=signs, settings=st)
    py = decode(codec, (24, cols), data, codebook=cb, rotation=signs)
    assert py.tobytes() == c_decode(codec, (24, cols), data, cb, signs).tobytes()


def test_rvq_decode_random_codes_and_scales_bit_identical() -> None:
    """Arbitrary bytes (incl. f16 subnormals, inf) decode identically in C and Python."""
    codec = {"name": "rvq", "stages": 4, "dim": 8, "entries": 256, "rotation": "hadamard",
             "rotation_block": 16}
    shape = (70, 48)  # two code tiles, the second with 58 padding rows
    from moepack.format.codecs import encoded_nbytes

    data = RNG.integers(0, 256, encoded_nbytes(codec, shape), dtype=np.uint8)
    scales = data[len(data) - 140 :].view(np.uint16)
    scales[:3] = [0x0001, 0x03FF, 0x8200]  # subnormals, negative subnormal
    cb = (RNG.standard_normal((4, 256, 8)) * 3).astype(np.float32)
    signs = np.where(RNG.random(48) < 0.5, -1.0, 1.0).astype(np.float32)
    py = decode(codec, shape, data.tobytes(), codebook=cb, rotation=signs)
    c = c_decode(codec, shape, data.tobytes(), cb, signs)
    assert np.array_equal(py.view(np.uint32), c.view(np.uint32))


def test_f16_conversion_matches_numpy_for_all_patterns() -> None:
    bits = np.arange(65536, dtype=np.uint16)
    data = bits.view(np.uint8).tobytes() + np.ones(65536, np.int8).tobytes()
    codec = {"name": "q8", "group_size": 32}
    # one scale per group of 32 → rows of 32 columns, q = 1: value = f32(scale)
    shape = (65536, 32)
    scales = bits.view("<f2").astype(np.float32)
    payload = bits.view(np.uint8).tobytes() + np.ones((65536, 32), np.int8).tobytes()
    c = c_decode(codec, shape, payload)[:, 0]
    finite = ~np.isnan(scales)
    assert np.array_equal(c[finite].view(np.uint32), scales[finite].view(np.uint32))
    assert np.all(np.isnan(c[~finite]))
    del data


def test_fwht_c_matches_python() -> None:
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    a = fwht_(x.copy(), 64)
    b = native.fwht_(x.copy(), 64)
    assert a.tobytes() == b.tobytes()


def test_assign_ties_go_to_lowest_index() -> None:
    cb = np.zeros((256, 8), np.float32)
    cb[10] = 1.0
    cb[20] = 1.0  # duplicate of entry 10
    x = np.ones((3, 8), np.float32)
    idx, dist = native.assign(x, cb)
    assert idx.tolist() == [10, 10, 10] and dist.tolist() == [0.0, 0.0, 0.0]
    idx, _ = native.assign(np.full((1, 8), 0.5, np.float32), cb)
    assert idx[0] == 0  # equidistant from 0 and 10: lowest index


@pytest.mark.parametrize("k", [256, 100, 3])
def test_assign_matches_reference_scores(k: int) -> None:
    """Nearest = least |c|^2 - 2 x.c, each summed in dimension order in f32 (codec.h)."""
    x = RNG.standard_normal((501, 8)).astype(np.float32)
    cb = RNG.standard_normal((k, 8)).astype(np.float32)
    dot = x[:, None, 0] * cb[None, :, 0]
    cn = cb[:, 0] * cb[:, 0]
    for d in range(1, 8):
        dot = dot + x[:, None, d] * cb[None, :, d]
        cn = cn + cb[:, d] * cb[:, d]
    score = cn[None] - (dot + dot)
    idx, dist = native.assign(x, cb)
    assert np.array_equal(idx, score.argmin(1))
    exact = np.sum((x - cb[idx]) ** 2, axis=1)
    assert np.allclose(dist, exact, atol=1e-4)


def test_beam_search_beats_greedy() -> None:
    """Not per vector (a pruned greedy path can win at the last stage), but on average."""
    x = RNG.standard_normal((2000, 8)).astype(np.float32)
    cb = (RNG.standard_normal((3, 256, 8)) * [[[1.0]], [[0.5]], [[0.25]]]).astype(np.float32)

    def err(codes: np.ndarray) -> np.ndarray:
        rec = cb[0][codes[:, 0]] + cb[1][codes[:, 1]] + cb[2][codes[:, 2]]
        return np.sum((x - rec) ** 2, axis=1)

    greedy = err(native.rvq_encode(x, cb, beam=1))
    beam = err(native.rvq_encode(x, cb, beam=8))
    assert np.mean(beam <= greedy + 1e-6) > 0.9 and beam.mean() < 0.95 * greedy.mean()


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="beam"):
        native.rvq_encode(np.zeros((1, 8), np.float32), np.zeros((3, 256, 8), np.float32), beam=17)
    with pytest.raises(ValueError, match="shape"):
        native.assign(np.zeros((4, 4), np.float32), np.zeros((256, 8), np.float32))
