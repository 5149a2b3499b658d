"""The codec interface (spec/FORMAT.md §8): one subclass per codec, listed once in
moepack.format.codecs.CODECS.

A codec class holds everything about its encoding that a reader needs (allowed keys, checks,
encoded size, reference decode) and names its encoder, which lives with the converter (it pulls
in the k-means machinery a reader never needs).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from moepack.format.errors import FormatError


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def bad_codec(why: str) -> FormatError:
    """A codec object that breaks its codec's own rules (CODECS.md): code `bad_codec`."""
    return FormatError(why, "bad_codec")


def int_field(codec: dict, key: str) -> int:
    if key not in codec:
        raise bad_codec(f"codec {codec.get('name')!r}: missing key {key!r}")
    v = codec[key]
    if type(v) is not int:  # bool is an int subclass: refuse it too
        raise bad_codec(f"codec {codec.get('name')!r}: {key!r} must be an integer, got {v!r}")
    return v


class Codec:
    """One codec. Methods get a codec object already checked by `check` (except `check`)."""

    name: ClassVar[str]
    keys: ClassVar[frozenset[str]] = frozenset()  # allowed keys besides "name"
    matrix: ClassVar[bool] = True  # only 2-D shapes [rows, cols]
    # "module:function" of the encoder, called as fn(codec, w, refs) -> bytes
    # (moepack.convert.quant.encode resolves it)
    encoder: ClassVar[str]

    def check(self, codec: dict, shape: tuple[int, ...]) -> None:
        """Raise FormatError unless the codec's own fields are valid for `shape` (keys, the
        shape's form and the 2-D rule are checked before)."""

    def nbytes(self, codec: dict, shape: tuple[int, ...]) -> int:
        """Exact encoded size in bytes."""
        raise NotImplementedError

    def decode(self, codec: dict, shape: tuple[int, ...], buf: np.ndarray,
               codebook: np.ndarray | None, rotation: np.ndarray | None) -> np.ndarray:
        """Reference decode of buf (u8, size-checked) to f32 of `shape`."""
        raise NotImplementedError
