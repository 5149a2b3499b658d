"""Group and float codecs: size rules, validation, round trips, padding (spec/CODECS.md §1-2)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moepack.convert.quant import TRUNK_CODECS, encode
from moepack.format import FormatError
from moepack.format.codecs import decode, encoded_nbytes, validate_codec

RNG = np.random.default_rng(7)
Q6 = TRUNK_CODECS["q6"]
GROUP = {k: TRUNK_CODECS[k] for k in ("q8", "q6", "q4", "q4-zp")}


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


@pytest.mark.parametrize("codec", list(GROUP.values()))
def test_group_error_on_gaussian(codec: dict) -> None:
    w = RNG.standard_normal((64, 256)).astype(np.float32)
    err = rel_err(decode(codec, w.shape, encode(codec, w)), w)
    # measured (docs/QUANTIZATION.md): q8 ≈ 0.5%, q6 ≈ 2.0%, q4 ≈ 8%
    assert err < {"q8": 0.007, "q6": 0.024}.get(codec["name"], 0.095)


def _pack6(k: list[int]) -> bytes:
    """CODECS.md §2.3 packing written out: 3 bytes per 4 codes, little-endian 24-bit words."""
    return b"".join((k[j] | k[j + 1] << 6 | k[j + 2] << 12 | k[j + 3] << 18).to_bytes(3, "little")
                    for j in range(0, len(k), 4))


def test_q6_decode_follows_the_spec_on_hand_made_bytes() -> None:
    codec = {"name": "q6", "group_size": 16}
    rows = [[0, 63, 32, 33, 1, 31, 62, 2, 17, 48] + [32] * 6,  # 10 cols + 6 padding
            [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] + [0, 63, 1, 2, 3, 4]]  # junk padding codes
    scales = np.array([0.5, -2.0], "<f2")
    data = scales.tobytes() + _pack6(rows[0]) + _pack6(rows[1])
    assert len(data) == encoded_nbytes(codec, (2, 10)) == 2 * 2 + 2 * 12
    want = np.array([np.float32(s) * (np.array(k[:10], np.float32) - 32)
                     for s, k in zip(scales, rows, strict=True)], np.float32)
    assert decode(codec, (2, 10), data).tobytes() == want.tobytes()
    assert _pack6([1, 2, 3, 4]) == bytes([0x81, 0x30, 0x10])  # 1 | 2<<6 | 3<<12 | 4<<18


@pytest.mark.parametrize("g", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 33), (2, 256), (5, 300)])
def test_q6_size_rule(g: int, rows: int, cols: int) -> None:
    cols_p = -(-cols // g) * g
    want = 2 * rows * (cols_p // g) + rows * cols_p * 3 // 4
    codec = {"name": "q6", "group_size": g}
    assert encoded_nbytes(codec, (rows, cols)) == want
    assert len(encode(codec, RNG.standard_normal((rows, cols)).astype(np.float32))) == want


def test_q6_padding_zero_group_and_grid() -> None:
    w = np.array([[3.0, -1.0, 0.25]], np.float32)  # group 16: columns 3..15 are padding
    data = encode({"name": "q6", "group_size": 16}, w)
    d = np.frombuffer(data[:2], "<f2")[0]
    codes = [(int.from_bytes(data[2 + 3 * j: 5 + 3 * j], "little") >> 6 * i) & 63
             for j in range(4) for i in range(4)]
    assert codes[3:] == [32] * 13  # padding columns are weight 0
    assert codes[:3] == [int(np.clip(np.rint(np.float32(v) / np.float32(d)), -32, 31)) + 32
                         for v in w[0]]
    zero = encode({"name": "q6", "group_size": 32}, np.zeros((2, 40), np.float32))
    assert zero[:8] == bytes(8)  # scale +0 (not -0) for a zero group
    assert zero[8:] == bytes([0x20, 0x08, 0x82]) * (len(zero[8:]) // 3)  # code 32 everywhere
    # every level once: row 0 (m = -4) is exact under t = -32, row 1 (m = 3.875) under t = -31
    grid = ((np.arange(64, dtype=np.float32) - 32) * np.float32(0.125)).reshape(2, 32)
    assert np.array_equal(decode(Q6, grid.shape, encode(Q6, grid)), grid)


def test_q6_between_q8_and_q4_and_deterministic() -> None:
    w = (RNG.standard_t(4, (48, 200)) * 0.02).astype(np.float32)
    errs = {n: rel_err(decode(c, w.shape, encode(c, w)), w) for n, c in GROUP.items()}
    assert errs["q8"] < errs["q6"] < errs["q4"] and errs["q6"] < errs["q4"] / 3
    assert encode(Q6, w) == encode(Q6, w.copy())


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
    for codec in GROUP.values():
        assert not decode(codec, w.shape, encode(codec, w)).any()


@pytest.mark.parametrize(
    "codec, shape, msg",
    [
        ({"name": "q8", "group_size": 48}, (2, 2), "group_size"),
        ({"name": "q8", "group_size": True}, (2, 2), "integer"),
        ({"name": "q4", "group_size": 32, "zero_point": 1}, (2, 2), "zero_point"),
        ({"name": "q8", "group_size": 32}, (2, 2, 2), "2-D"),
        ({"name": "q8", "group_size": 32, "x": 1}, (2, 2), "unknown keys"),
        ({"name": "q6", "group_size": 8}, (2, 2), r"codec 'q6': group_size 8 not in \[16, 32"),
        ({"name": "q6", "group_size": 48}, (2, 2), "group_size 48 not in"),
        ({"name": "q6", "group_size": "32"}, (2, 2), "'group_size' must be an integer"),
        ({"name": "q6"}, (2, 2), "codec 'q6': missing key 'group_size'"),
        ({"name": "q6", "group_size": 32, "zero_point": False}, (2, 2),
         r"codec 'q6': unknown keys \['zero_point'\]"),
        ({"name": "q6", "group_size": 32}, (64,), "2-D"),
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


@pytest.mark.parametrize("name", list(GROUP))
def test_group_encoders_reject_non_finite_and_huge(name: str) -> None:
    codec = GROUP[name]
    w = np.ones((2, 32), np.float32)
    w[1, 3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        encode(codec, w)
    with pytest.raises(ValueError, match="f16"):
        encode(codec, np.full((1, 32), 1e8, np.float32))


def test_presets_are_complete_and_valid() -> None:
    from moepack.convert.quant import EXPERT_PRESETS, TRUNK_DEFAULTS, codec_for, expert_settings

    assert {"rvq3", "rvq3-m", "rvq3-l", "rvq3-baseline", "rvq2", "rvq4"} <= set(EXPERT_PRESETS)
    for name in EXPERT_PRESETS:
        for part in ("gate", "up", "down"):
            validate_codec(codec_for(expert_settings(name), (64, 256), part), (64, 256))
    stages = {p: codec_for(expert_settings("rvq3-l"), (64, 256), p)["stages"]
              for p in ("gate", "up", "down")}
    assert stages == {"gate": 4, "up": 3, "down": 4}
    assert set(TRUNK_DEFAULTS) == {"attn", "shared_expert", "dense_ffn", "embed", "lm_head", "norm",
                                   "router", "bias", "codebook"}
    for cls in ("norm", "router", "bias"):
        assert TRUNK_DEFAULTS[cls] == "f32"
    assert TRUNK_DEFAULTS["codebook"] == "f16"  # f32 or f16 only (CODECS.md §3); f16 documented
    with pytest.raises(ValueError, match="projection name"):  # a mixed preset needs the part
        codec_for(expert_settings("rvq3-l"), (64, 256))
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
    name=st.sampled_from(["f32", "q8", "q6", "q4", "rvq", "x"]),
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
    codec=st.sampled_from([TRUNK_CODECS[k] for k in ("q8", "q4", "q4-zp", "q4-g16")]
                          + [Q6, {"name": "q6", "group_size": 16}]),
    rows=st.integers(1, 5),
    cols=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_decode_any_bytes_of_the_right_length(codec: dict, rows: int, cols: int,
                                              seed: int) -> None:
    n = encoded_nbytes(codec, (rows, cols))
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert decode(codec, (rows, cols), data).shape == (rows, cols)
