"""MXFP4 weights (OCP Microscaling FP4: gpt-oss, Kimi K3's routed experts), dequantised exactly
to float32 with numpy.

A row of `cols` values is stored as `cols/2` code bytes and `cols/32` scale bytes:
- codes: element `2i` in the low nibble of byte `i`, element `2i+1` in the high nibble; a nibble
  is FP4 E2M1 (sign bit 3; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 for codes 0..7).
- scales: one E8M0 byte `e` per 32 consecutive values of the row, the factor `2^(e-127)`;
  `e = 255` is E8M0's NaN.
`w = fp4(code) · 2^(e-127)`. Every finite product is exactly a float32 (at most two significant
bits, exponent -128..129); exponents 253 and 254 overflow for the larger codes and are refused.

Two checkpoint layouts hold these bytes (the same bytes, named and shaped differently):
- gpt-oss (`quantization_config.quant_method` "mxfp4"): `X_blocks` uint8 `[..., rows, G, 16]`
  and `X_scales` uint8 `[..., rows, G]` for the tensor `X` `[..., rows, 32·G]` (transformers'
  `convert_moe_packed_tensors` then transposes the last two axes for gpt-oss's `x @ W`).
- compressed-tensors "mxfp4-pack-quantized" (Kimi K3, DeepSeek-V4): `X.weight_packed` uint8
  `[rows, cols/2]` and `X.weight_scale` uint8 (or F8_E8M0) `[rows, cols/32]` for `X.weight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from moepack.convert.errors import SourceError
from moepack.convert.st_header import TensorInfo

MXFP4 = "MXFP4"  # the dtype the checkpoint reader reports for an MXFP4 weight
GROUP = 32
GPT_OSS, COMPRESSED = "gpt_oss", "compressed_tensors"
CT_FORMAT = "mxfp4-pack-quantized"
CODE_DTYPES = ("U8", "I8")
SCALE_DTYPES = ("U8", "F8_E8M0")
E8M0_NAN = 255

FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


class Mxfp4Error(SourceError):
    """The source checkpoint's quantisation config or tensors are not an MXFP4 layout moepack
    reads (a source problem, not a container FormatError)."""


def layout_from_config(config: Mapping[str, Any]) -> str | None:
    """GPT_OSS or COMPRESSED for a config.json whose `quantization_config` (top level or in
    `text_config`) declares MXFP4 weights, else None."""
    qc = config.get("quantization_config")
    text = config.get("text_config")
    if qc is None and isinstance(text, dict):
        qc = text.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    if qc.get("quant_method") == "mxfp4":
        return GPT_OSS
    if qc.get("quant_method") != "compressed-tensors":
        return None
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise Mxfp4Error("quantization_config.config_groups must be an object")
    mx = [g for g in groups.values()
          if isinstance(g, dict) and g.get("format", qc.get("format")) == CT_FORMAT]
    if not mx and qc.get("format") != CT_FORMAT:
        return None
    for g in mx:
        _check_weights(g.get("weights"))
    return COMPRESSED


def _check_weights(w: Any) -> None:
    """An mxfp4-pack-quantized group's weight scheme must be what the format means."""
    if w is None:
        return
    if not isinstance(w, dict):
        raise Mxfp4Error(f"quantization_config: {CT_FORMAT} 'weights' must be an object")
    bits, kind, size = w.get("num_bits", 4), w.get("type", "float"), w.get("group_size", GROUP)
    if bits != 4 or kind != "float" or size != GROUP or w.get("symmetric", True) is not True:
        raise Mxfp4Error(f"quantization_config: {CT_FORMAT} weights of {bits!r}-bit "
                               f"{kind!r}, group_size {size!r} are not MXFP4 (symmetric 4-bit "
                               f"float, groups of {GROUP})")


def part_names(name: str, layout: str) -> tuple[str, str]:
    """(codes tensor, scales tensor) holding the MXFP4 tensor `name`."""
    if layout == GPT_OSS:
        return name + "_blocks", name + "_scales"
    base = name.removesuffix("weight")
    return base + "weight_packed", base + "weight_scale"


def virtual_tensors(tensors: Mapping[str, TensorInfo], layout: str) -> dict[str, TensorInfo]:
    """The dequantised tensors an MXFP4 checkpoint holds: name -> TensorInfo of dtype MXFP4 and
    the dequantised shape (offsets: the codes tensor's). Header reads only."""
    suffix = "_blocks" if layout == GPT_OSS else ".weight_packed"
    out = {}
    for cname in [n for n in tensors if n.endswith(suffix)]:
        name = cname.removesuffix("_blocks") if layout == GPT_OSS \
            else cname.removesuffix("_packed")
        codes, sname = tensors[cname], part_names(name, layout)[1]
        where = f"{codes.file}: tensor {cname!r}"
        if name in tensors:
            raise Mxfp4Error(f"{where}: the checkpoint also has {name!r}")
        scales = tensors.get(sname)
        if scales is None:
            raise Mxfp4Error(f"{where}: MXFP4 codes without their scales {sname!r}")
        out[name] = replace(codes, dtype=MXFP4, shape=_shape(codes, scales, layout, where))
    return out


def _shape(codes: TensorInfo, scales: TensorInfo, layout: str, where: str) -> tuple[int, ...]:
    """The dequantised shape, after checking the two tensors' dtypes and shapes agree."""
    if codes.dtype not in CODE_DTYPES or scales.dtype not in SCALE_DTYPES:
        raise Mxfp4Error(f"{where}: MXFP4 codes must be {'/'.join(CODE_DTYPES)} and "
                               f"scales {'/'.join(SCALE_DTYPES)}, got {codes.dtype} and "
                               f"{scales.dtype}")
    c, s = codes.shape, scales.shape
    if layout == GPT_OSS:
        ok = len(c) >= 3 and c[-1] == GROUP // 2 and c[:-1] == s
        want = "[..., rows, groups, 16] with scales [..., rows, groups]"
        shape = (*c[:-2], c[-2] * GROUP) if ok else ()
    else:
        ok = len(c) == 2 and len(s) == 2 and c[0] == s[0] and c[1] * 2 == s[1] * GROUP
        want = "[rows, cols/2] with scales [rows, cols/32]"
        shape = (c[0], c[1] * 2) if ok else ()
    if not ok or 0 in shape:
        raise Mxfp4Error(f"{where}: MXFP4 codes {list(c)} and scales {list(s)} do not "
                               f"fit (expected {want})")
    return shape


def dequantize(codes: np.ndarray, exps: np.ndarray, where: str = "MXFP4 tensor") -> np.ndarray:
    """float32 `[rows, 32·G]` from uint8 codes `[rows, 16·G]` and E8M0 exponents `[rows, G]`;
    Mxfp4Error naming row and group for a NaN scale or a value beyond float32."""
    rows, groups = exps.shape
    if codes.shape != (rows, groups * GROUP // 2):
        raise Mxfp4Error(f"{where}: {codes.shape[-1]} code bytes per row for {groups} "
                               "scale groups")
    codes = codes.view(np.uint8) if codes.dtype == np.int8 else codes
    nibbles = np.stack((codes & 0xF, codes >> 4), axis=-1).reshape(rows, groups, GROUP)
    e = exps.view(np.uint8) if exps.dtype != np.uint8 else exps
    bad = e == E8M0_NAN
    if bad.any():
        r, g = (int(i[0]) for i in np.nonzero(bad))
        raise Mxfp4Error(f"{where}: row {r} group {g}: scale byte 255 is E8M0's NaN")
    with np.errstate(over="ignore"):  # reported below, with the row and group
        w = np.ldexp(FP4_E2M1[nibbles], e.astype(np.int32)[..., None] - 127)
    if not np.isfinite(w).all():
        r, g, _ = (int(i[0]) for i in np.nonzero(~np.isfinite(w)))
        raise Mxfp4Error(f"{where}: row {r} group {g}: scale 2^{int(e[r, g]) - 127} "
                               "overflows float32 (a damaged checkpoint)")
    return w.reshape(rows, groups * GROUP)


def encode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, exponents) of float32 `[rows, cols]` (cols a multiple of 32), rounded to the
    nearest FP4 value under the group's power-of-two scale (tests and fixtures): the scale is
    2^(floor(log2(max |w|)) - 2), as compressed-tensors and OCP's reference choose it."""
    rows, cols = w.shape
    g = w.astype(np.float32).reshape(rows, cols // GROUP, GROUP)
    amax = np.abs(g).max(-1)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127) + 127
    e = np.clip(e, 0, 254).astype(np.uint8)
    x = g / np.ldexp(np.float32(1), e.astype(np.int32) - 127)[..., None]
    mags = FP4_E2M1[:8]
    idx = np.abs(np.abs(x)[..., None] - mags).argmin(-1).astype(np.uint8)
    idx |= np.where(np.signbit(x), 8, 0).astype(np.uint8)
    flat = idx.reshape(rows, cols)
    return (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8), e
