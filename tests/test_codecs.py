"""Group and float codecs: size rules, validation, round trips, padding (spec/CODECS.md §1-2)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moepack.convert.quant import TRUNK_CODECS, encode
from moepack.format import FormatError
from moepack.format.codecs import decode, encoded_nbytes, validate_codec

RNG = np.random.default_rng(7)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("shape", [(4, 5), (3, 32), (7, 33), (2, 100), (1, 1)])
@pytest.mark.parametrize("name", sorted(TRUNK_CODECS))
def test_round_trip_and_size(name: str, shape: tuple[int, int]) -> None:
    codec = TRUNK_CODECS[name]
    w = RNG.standard_normal(shape).astype(np.float32)
    data = encode(codec, w)
    assert len(data) == encoded_nbytes(codec, shape)
    out = decode(codec, shape, data)
    assert out.dtype == np.float32 and out.shape == shape
    bound = {"f32": 0.0, "f16": 1e-3, "bf16": 1e-2, "q8": 0.02}.get(name, 0.2)
    assert rel_err(out, w) <= bound


@pytest.mark.parametrize("codec", [TRUNK_CODECS["q8"], TRUNK_CODECS["q4"], TRUNK_CODECS["q4-zp"]])
def test_group_error_on_gaussian(codec: dict) -> None:
    w = RNG.standard_normal((64, 256)).astype(np.float32)
    err = rel_err(decode(codec, w.shape, encode(codec, w)), w)
    # measured (docs/QUANTIZATION.md): q8 ≈ 0.5%, q4 ≈ 8%
    assert err < (0.007 if codec["name"] == "q8" else 0.095)


def test_q8_layout_matches_format_spec() -> None:
    w = np.array([[1.0, -2.0, 0.5] + [0.0] * 29 + [127.0]], np.float32)  # 33 cols: 2 groups
    data = encode({"name": "q8", "group_size": 32}, w)
    scales = np.frombuffer(data[:4], "<f2")
    q = np.frombuffer(data[4:], np.int8)
    assert scales[0] == np.float16(2.0 / 127) and scales[1] == np.float16(1.0)
    assert q[0] == round(1.0 / float(scales[0])) and q[32] == 127
    assert np.all(q[33:] == 0)  # padding columns encode as 0


def test_q4_nibble_order_and_padding() -> None:
    w = np.zeros((1, 3), np.float32)
    w[0] = [-8.0, 7.0, 1.0]
    data = encode({"name": "q4", "group_size": 16, "zero_point": False}, w)
    assert np.frombuffer(data[:2], "<f2")[0] == np.float16(1.0)
    packed = np.frombuffer(data[2:], np.uint8)
    assert packed[0] == (0 | (15 << 4))  # col 0 -> low nibble (code 0 = -8), col 1 -> high
    assert packed[1] & 15 == 9 and packed[1] >> 4 == 8  # col 2 = +1; padding col 3 = weight 0
    assert np.all(packed[2:] == 0x88)


def test_q4_zero_point_exact_on_grid() -> None:
    w = (np.arange(32, dtype=np.float32) % 16 * 0.5 - 1.0).reshape(1, 32)
    codec = {"name": "q4", "group_size": 32, "zero_point": True}
    assert np.array_equal(decode(codec, w.shape, encode(codec, w)), w)


def test_zero_rows_stay_zero() -> None:
    w = np.zeros((3, 40), np.float32)
    for name in ("q8", "q4", "q4-zp"):
        codec = TRUNK_CODECS[name]
        assert not decode(codec, w.shape, encode(codec, w)).any()


@pytest.mark.parametrize(
    "codec, shape, msg",
    [
        ({"name": "q8", "group_size": 48}, (2, 2), "group_size"),
        ({"name": "q8", "group_size": True}, (2, 2), "integer"),
        ({"name": "q4", "group_size": 32, "zero_point": 1}, (2, 2), "zero_point"),
        ({"name": "q8", "group_size": 32}, (2, 2, 2), "2-D"),
        ({"name": "q8", "group_size": 32, "x": 1}, (2, 2), "unknown keys"),
        ({"name": "q5"}, (2, 2), "unknown codec"),
        ({"name": "f16"}, (0, 2), "bad shape"),
        ({"name": "rvq", "stages": 9, "dim": 8, "entries": 256}, (2, 8), "stages"),
        ({"name": "rvq", "stages": 3, "dim": 4, "entries": 256}, (2, 8), "dim"),
        ({"name": "rvq", "stages": 3, "dim": 8, "entries": 256, "rotation": "haar"}, (2, 8),
         "rotation"),
        ({"name": "rvq", "stages": 3, "dim": 8, "entries": 256, "rotation": "hadamard",
          "rotation_block": 16}, (2, 24), "rotation_block"),
        ({"name": "rvq", "stages": 3, "dim": 8, "entries": 256, "rotation_block": 8}, (2, 8),
         "rotation_block"),
    ],
)
def test_validate_rejects(codec: dict, shape: tuple, msg: str) -> None:
    with pytest.raises(FormatError, match=msg):
        validate_codec(codec, shape)


def test_decode_rejects_wrong_length() -> None:
    codec = TRUNK_CODECS["q8"]
    with pytest.raises(FormatError, match="expected"):
        decode(codec, (2, 32), b"\0" * 10)


def test_bf16_rounds_to_nearest_even() -> None:
    w = np.array([[1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.inf]], np.float32)
    out = decode({"name": "bf16"}, w.shape, encode({"name": "bf16"}, w))
    assert out.tolist() == [[1.0, 1.0 + 2**-6, -2.5, np.inf]]


@pytest.mark.parametrize("name", ["q8", "q4", "q4-zp"])
def test_group_encoders_reject_non_finite_and_huge(name: str) -> None:
    codec = TRUNK_CODECS[name]
    w = np.ones((2, 32), np.float32)
    w[1, 3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        encode(codec, w)
    with pytest.raises(ValueError, match="f16"):
        encode(codec, np.full((1, 32), 1e8, np.float32))


def test_presets_are_complete_and_valid() -> None:
    from moepack.convert.quant import EXPERT_PRESETS, TRUNK_DEFAULTS, codec_for, expert_settings

    assert {"rvq3", "rvq3-baseline", "rvq2", "rvq4"} <= set(EXPERT_PRESETS)
    for name in EXPERT_PRESETS:
        validate_codec(codec_for(expert_settings(name), (64, 256)), (64, 256))
    assert set(TRUNK_DEFAULTS) == {"attn", "shared_expert", "dense_ffn", "embed", "lm_head", "norm",
                                   "router", "bias", "codebook"}
    for cls in ("norm", "router", "bias", "codebook"):
        assert TRUNK_DEFAULTS[cls] == "f32"
    for name in TRUNK_DEFAULTS.values():
        validate_codec(TRUNK_CODECS[name], (4, 64))
    with pytest.raises(ValueError, match="rvq3"):
        expert_settings("rvq5")


_junk = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=4),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=5,
)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["f32", "q8", "q4", "rvq", "x"]),
    extra=st.dictionaries(
        st.sampled_from(["group_size", "zero_point", "stages", "dim", "entries", "rotation",
                         "rotation_block", "bogus"]), _junk, max_size=4),
    shape=st.lists(st.integers(-1, 40), min_size=0, max_size=3),
)
def test_validate_only_raises_format_error(name: str, extra: dict, shape: list) -> None:
    try:
        validate_codec({"name": name, **extra}, shape)
    except FormatError:
        return
    assert encoded_nbytes({"name": name, **extra}, tuple(shape)) >= 0


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from([TRUNK_CODECS[k] for k in ("q8", "q4", "q4-zp", "q4-g16")]),
    rows=st.integers(1, 5),
    cols=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_decode_any_bytes_of_the_right_length(codec: dict, rows: int, cols: int,
                                              seed: int) -> None:
    n = encoded_nbytes(codec, (rows, cols))
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert decode(codec, (rows, cols), data).shape == (rows, cols)
