"""Quantisation encoders: k-means/RVQ for experts, q8/q6/q4 groups and float passthrough for trunk.

`encode(codec, w, ...)` is the one entry point per tensor; `train_layer` trains a layer's
codebooks for one projection. Decoding lives in moepack.format.codecs.
"""

from __future__ import annotations

import numpy as np
from moepack.convert.quant.dense import encode_float
from moepack.convert.quant.groupq import encode_q4, encode_q6, encode_q8
from moepack.convert.quant.kmeans import train_codebooks
from moepack.convert.quant.presets import (
    DEFAULT_EXPERT_PRESET,
    EXPERT_PRESETS,
    TRUNK_CODECS,
    TRUNK_DEFAULTS,
    expert_settings,
)
from moepack.convert.quant.rvq import RvqSettings, codec_for, encode_rvq, layer_seed, train_layer
from moepack.format.codecs import validate_codec

__all__ = [
    "DEFAULT_EXPERT_PRESET", "EXPERT_PRESETS", "TRUNK_CODECS", "TRUNK_DEFAULTS", "RvqSettings",
    "codec_for", "encode", "encode_q4", "encode_q6", "encode_q8", "encode_rvq", "expert_settings",
    "layer_seed", "train_codebooks", "train_layer",
]


def encode(
    codec: dict,
    w: np.ndarray,
    *,
    codebook: np.ndarray | None = None,
    rotation: np.ndarray | None = None,
    settings: RvqSettings | None = None,
    threads: int = 1,
) -> bytes:
    """Encode w under `codec` (rvq needs the layer's codebook and, if rotated, its signs)."""
    validate_codec(codec, np.shape(w))
    name = codec["name"]
    if name in ("f32", "f16", "bf16"):
        return encode_float(name, w)
    if name == "q8":
        return encode_q8(w, codec["group_size"])
    if name == "q6":
        return encode_q6(w, codec["group_size"])
    if name == "q4":
        return encode_q4(w, codec["group_size"], zero_point=bool(codec.get("zero_point")))
    if codebook is None:
        raise ValueError("rvq encoding needs the layer's codebook (see train_layer)")
    if settings is None:
        settings = expert_settings(DEFAULT_EXPERT_PRESET)
    return encode_rvq(w, codec, codebook, settings, rotation, threads=threads)
