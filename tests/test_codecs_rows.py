"""The engine's row decode of trunk codecs (kernels.c mpk_row, exported as mp_decode_rows) gives
the bits of the Python reference decode (moepack.format.codecs.decode): the scalar kernels are
C's reference, checked here on encoded weights and on arbitrary bytes."""

from __future__ import annotations

import ctypes
import functools
import json

import numpy as np
import pytest
from moepack.convert.quant import TRUNK_CODECS, encode
from moepack.format.codecs import decode, encoded_nbytes
from moepack.runtime import _lib

RNG = np.random.default_rng(5)


@functools.cache
def _fn():
    fn = _lib.load().mp_decode_rows
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p,
                   ctypes.c_uint64, np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS"),
                   ctypes.c_char_p, ctypes.c_size_t]
    return fn


def c_decode(codec: dict, shape: tuple[int, int], data: bytes) -> np.ndarray:
    out = np.empty(shape, np.float32)
    err = ctypes.create_string_buffer(512)
    rc = _fn()(json.dumps(codec).encode(), shape[0], shape[1], data, len(data), out, err, 512)
    assert rc == 0, err.value.decode()
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", ["q8", "q6", "q4", "q4-zp", "q4-g16", "f16", "bf16", "f32"])
@pytest.mark.parametrize("shape", [(5, 70), (3, 256), (1, 7), (4, 300)])
def test_encoded_rows_bit_identical(name: str, shape: tuple[int, int]) -> None:
    codec = TRUNK_CODECS[name]
    w = (RNG.standard_t(3, shape) * 0.05).astype(np.float32)
    data = encode(codec, w)
    assert same_bits(decode(codec, shape, data), c_decode(codec, shape, data))


@pytest.mark.parametrize("codec", [
    {"name": "q6", "group_size": 16}, {"name": "q6", "group_size": 64},
    {"name": "q8", "group_size": 32}, {"name": "q4", "group_size": 16, "zero_point": True},
    {"name": "q4", "group_size": 128, "zero_point": False},
])
def test_random_bytes_bit_identical(codec: dict) -> None:
    """Any bytes: every code, f16 subnormal / inf / NaN scales, junk in padding columns."""
    shape = (11, 45)
    data = RNG.integers(0, 256, encoded_nbytes(codec, shape), dtype=np.uint8)
    scales = data[: 2 * 11 * -(-45 // codec["group_size"])].view(np.uint16)
    scales[:5] = [0x0001, 0x83FF, 0x7C00, 0xFC00, 0x7E01]
    py = decode(codec, shape, data.tobytes())
    assert same_bits(py, c_decode(codec, shape, data.tobytes()))


def test_f16_conversion_matches_numpy_for_all_patterns() -> None:
    """The engine's one f16 -> f32 conversion, through an f16 tensor of every bit pattern."""
    bits = np.arange(65536, dtype=np.uint16)
    c = c_decode({"name": "f16"}, (256, 256), bits.tobytes()).reshape(-1)
    want = bits.view("<f2").astype(np.float32)
    assert same_bits(c, want)


def test_refusals_name_the_problem() -> None:
    out = np.empty((1, 8), np.float32)
    err = ctypes.create_string_buffer(512)
    codec = json.dumps({"name": "q6", "group_size": 6}).encode()
    assert _fn()(codec, 1, 8, b"\0" * 64, 64, out, err, 512) != 0
    assert err.value.decode() == "codec 'q6': group_size 6 not in [16, 32, 64, 128, 256]"
    codec = json.dumps({"name": "q8", "group_size": 16}).encode()
    assert _fn()(codec, 1, 8, b"\0" * 64, 64, out, err, 512) != 0
    assert "the codec needs 18" in err.value.decode()
