"""Quantisation encoders: k-means/RVQ for experts, q8/q6/q4 groups and float passthrough for trunk.

`encode(codec, w, ...)` is the one entry point per tensor: it calls the encoder that the codec's
class names (moepack.format.codecs.CODECS). `train_layer` trains a layer's codebooks for one
projection. Decoding lives in moepack.format.codecs.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import numpy as np
from moepack.convert.quant.kmeans import train_codebooks
from moepack.convert.quant.presets import (
    DEFAULT_EXPERT_PRESET,
    EXPERT_PRESETS,
    TRUNK_CODECS,
    TRUNK_DEFAULTS,
    expert_settings,
)
from moepack.convert.quant.refs import EncodeRefs
from moepack.convert.quant.rvq import RvqSettings, codec_for, layer_seed, train_layer
from moepack.format.codecs import CODECS, validate_codec

__all__ = [
    "DEFAULT_EXPERT_PRESET", "EXPERT_PRESETS", "TRUNK_CODECS", "TRUNK_DEFAULTS", "EncodeRefs",
    "RvqSettings", "codec_for", "encode", "encoder", "expert_settings", "layer_seed",
    "train_codebooks", "train_layer",
]


@functools.cache
def encoder(name: str) -> Callable[[dict, np.ndarray, EncodeRefs], bytes]:
    """The encoder function a codec class names (format.codec_base.Codec.encoder)."""
    module, _, fn = CODECS[name].encoder.partition(":")
    return getattr(importlib.import_module(module), fn)


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
    refs = EncodeRefs(codebook=codebook, rotation=rotation, settings=settings, threads=threads)
    return encoder(codec["name"])(codec, w, refs)
