"""RVQ encoding of expert weights (spec/CODECS.md §3): row preparation, layer sampling, packing.

Memory stays bounded for real models: `train_layer` streams experts one at a time through a
callback, keeps only a fixed-size sample of vectors, then `encode_rvq` encodes expert by expert.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from moepack.convert.quant import native
from moepack.convert.quant.kmeans import train_codebooks
from moepack.convert.quant.refs import EncodeRefs
from moepack.convert.quant.rotation import make_signs, pick_block, rotate_rows
from moepack.format.codecs import RVQ_DIM, encoded_nbytes, rvq_tile_codes, validate_codec

F16_MAX = 65504.0


@dataclass(frozen=True)
class RvqSettings:
    """Encoder settings (none of them is needed to decode; the codec object carries those)."""

    stages: int = 3
    rotation: str = "none"  # "none" | "hadamard"
    max_block: int = 256  # rotation block: largest power of two ≤ this dividing cols
    scale: str = "absmax"  # row normalisation before coding: "absmax" | "rms"
    refit_scale: bool = False  # least-squares row scale after coding
    beam: int = 1  # beam width of the stage-code search (1 = greedy)
    iters: int = 10  # Lloyd iterations per stage
    sample: int = 300_000  # vectors sampled across the layer's experts for training
    refine: int = 0  # joint codebook refinement rounds after stage-wise training
    # (projection, stages) overriding `stages` for that projection, e.g. (("down", 4),): spends
    # bits where the error costs most, as llama.cpp's *_M mixes do
    part_stages: tuple[tuple[str, int], ...] = ()

    def stages_for(self, part: str | None) -> int:
        if part is None:
            if self.part_stages:  # a mixed preset cannot answer for "any projection"
                raise ValueError(f"settings with part_stages {dict(self.part_stages)} need the "
                                 "projection name (gate, up or down)")
            return self.stages
        return dict(self.part_stages).get(part, self.stages)

    def manifest(self) -> dict:
        """JSON form (part_stages as an object; absent when empty, as before it existed)."""
        d = dict(vars(self))
        d.pop("part_stages")
        if self.part_stages:
            d["part_stages"] = dict(self.part_stages)
        return d


def codec_for(settings: RvqSettings, shape: tuple[int, int], part: str | None = None) -> dict:
    """The codec object of a [rows, cols] expert projection `part` encoded with `settings`."""
    codec = {"name": "rvq", "stages": settings.stages_for(part), "dim": RVQ_DIM, "entries": 256,
             "rotation": "none"}
    if settings.rotation == "hadamard":
        block = pick_block(shape[1], settings.max_block)
        if block >= 2:  # a 1-column block would be the identity: fall back to "none"
            codec.update(rotation="hadamard", rotation_block=block)
    elif settings.rotation != "none":
        raise ValueError(f"unknown rotation {settings.rotation!r}")
    validate_codec(codec, shape)
    return codec


def layer_seed(base_seed: int, layer: int, part: str) -> int:
    """Seed of one (layer, projection): stable across runs, machines and Python versions."""
    h = hashlib.blake2b(f"{base_seed}/{layer}/{part}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def _row_scales(w: np.ndarray, mode: str) -> np.ndarray:
    """Initial row scale, rounded through f16 (the stored precision)."""
    if mode == "absmax":
        s = np.max(np.abs(w), axis=1)
    elif mode == "rms":
        s = np.sqrt(np.sum(np.square(w, dtype=np.float64), axis=1) / w.shape[1])
    else:
        raise ValueError(f"unknown row scale mode {mode!r}")
    if np.any(s > F16_MAX) or not np.all(np.isfinite(s)):
        raise ValueError("weights too large for an f16 row scale (or not finite)")
    return s.astype(np.float16).astype(np.float32)


def prepare(
    w: np.ndarray, codec: dict, settings: RvqSettings, signs: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rotated rows w' [rows, cols], normalised vectors [rows*nv, 8], f16-rounded scales)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"rvq needs a 2-D weight, got shape {list(w.shape)}")
    if codec.get("rotation") == "hadamard":
        w = rotate_rows(w, signs, codec["rotation_block"])
    rows, cols = w.shape
    nv = -(-cols // RVQ_DIM)
    s = _row_scales(w, settings.scale)
    x = np.zeros((rows, nv * RVQ_DIM), np.float32)  # padding columns stay zero
    safe = np.where(s > 0, s, np.float32(1))
    x[:, :cols] = np.where(s[:, None] > 0, w / safe[:, None], np.float32(0))
    return w, x.reshape(rows * nv, RVQ_DIM), s


def sample_layer(
    get_expert: Callable[[int], np.ndarray],
    count: int,
    codec: dict,
    settings: RvqSettings,
    signs: np.ndarray | None,
    seed: int,
) -> np.ndarray:
    """A deterministic sample of ≤ settings.sample normalised vectors, equal share per expert."""
    rng = np.random.default_rng([seed, 0x5A4D])
    per = -(-settings.sample // count)
    parts = []
    for e in range(count):
        _, x, _ = prepare(get_expert(e), codec, settings, signs)
        if x.shape[0] > per:
            x = x[np.sort(rng.choice(x.shape[0], per, replace=False))]
        parts.append(x)
    return np.concatenate(parts)


def train_layer(
    get_expert: Callable[[int], np.ndarray],
    count: int,
    shape: tuple[int, int],
    settings: RvqSettings,
    seed: int,
    *,
    part: str | None = None,
    threads: int = 1,
) -> tuple[dict, np.ndarray, np.ndarray | None]:
    """(codec, codebook [S, 256, 8] f32, rotation signs [cols] f32 or None) of one projection."""
    codec = codec_for(settings, shape, part)
    signs = make_signs(shape[1], seed) if codec["rotation"] == "hadamard" else None
    sample = sample_layer(get_expert, count, codec, settings, signs, seed)
    cb = train_codebooks(sample, codec["stages"], seed=seed, iters=settings.iters,
                         refine=settings.refine, beam=settings.beam, threads=threads)
    return codec, cb, signs


def _sum_stages(cb: np.ndarray, codes: np.ndarray) -> np.ndarray:
    acc = cb[0][codes[:, 0]]
    for s in range(1, cb.shape[0]):
        acc = acc + cb[s][codes[:, s]]
    return acc


def encode_rvq(
    w: np.ndarray,
    codec: dict,
    codebook: np.ndarray,
    settings: RvqSettings,
    signs: np.ndarray | None = None,
    *,
    threads: int = 1,
) -> bytes:
    """Encoded bytes of one expert projection w [rows, cols]: codes in 64-row tiles, then the
    f16 row scales (spec/CODECS.md §3)."""
    validate_codec(codec, w.shape)
    cb = np.ascontiguousarray(codebook, dtype=np.float32)
    if cb.shape != (codec["stages"], 256, RVQ_DIM):
        raise ValueError(f"codebook shape {list(cb.shape)} does not match codec")
    wr, x, s = prepare(w, codec, settings, signs)
    rows, cols = wr.shape
    codes = native.rvq_encode(x, cb, beam=settings.beam, threads=threads)
    if settings.refit_scale:  # s = <w', q> / <q, q> per row, in f64
        q = _sum_stages(cb, codes).reshape(rows, -1)[:, :cols].astype(np.float64)
        qq = np.sum(q * q, axis=1)
        wq = np.sum(q * wr.astype(np.float64), axis=1)
        s = np.where(qq > 0, wq / np.where(qq > 0, qq, 1.0), 0.0)
        s = np.clip(s, -F16_MAX, F16_MAX)
    tiles = rvq_tile_codes(codes.reshape(rows, -1, codec["stages"]))  # 64-row tiles (1.1)
    out = tiles.tobytes() + np.asarray(s, dtype="<f2").tobytes()
    if len(out) != encoded_nbytes(codec, (rows, cols)):
        raise AssertionError("rvq layout and encoded_nbytes disagree")
    return out


def encode_codec(codec: dict, w: np.ndarray, refs: EncodeRefs) -> bytes:
    """The rvq encoder (format.codec_rvq): needs the layer's codebook (see train_layer)."""
    if refs.codebook is None:
        raise ValueError("rvq encoding needs the layer's codebook (see train_layer)")
    settings = refs.settings
    if settings is None:  # the default preset's search (its stages come from the codec)
        from moepack.convert.quant.presets import DEFAULT_EXPERT_PRESET, expert_settings

        settings = expert_settings(DEFAULT_EXPERT_PRESET)
    return encode_rvq(w, codec, refs.codebook, settings, refs.rotation, threads=refs.threads)
