"""MXFP4 sources (gpt-oss `_blocks`/`_scales`, compressed-tensors "mxfp4-pack-quantized" as Kimi
K3 ships its experts): the decoder against a by-hand decoding of the OCP format and against
transformers' own dequantisation, the checkpoint reader on files the tests write, hostile
inputs, and a tiny DeepSeek-V3 with MXFP4 experts converted and exported bit for bit."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import SourceError
from moepack.convert.mapping import bind
from moepack.convert.mxfp4 import (
    COMPRESSED,
    GPT_OSS,
    Mxfp4Error,
    dequantize,
    encode,
    layout_from_config,
)
from moepack.convert.source import Checkpoint, SourceRef
from safetensors.numpy import save_file
from safetensors.torch import load_file
from safetensors.torch import save_file as save_torch
from tiny_models import make_checkpoint
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

CT_CONFIG = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                 "num_bits": 4, "type": "float", "symmetric": True, "strategy": "group",
                 "group_size": 32, "scale_dtype": "torch.uint8"}}}}


def _by_hand(code: int, exp: int) -> Fraction:
    """OCP MX: E2M1 (1 sign, 2 exponent bits with bias 1, 1 mantissa bit; exponent 0 is
    subnormal) times the E8M0 scale 2^(exp - 127)."""
    sign = -1 if code & 8 else 1
    e, m = (code >> 1) & 3, code & 1
    mag = Fraction(m, 2) if e == 0 else (1 + Fraction(m, 2)) * Fraction(2) ** (e - 1)
    return sign * mag * Fraction(2) ** (exp - 127)


def _random(rng, rows: int, groups: int, lo: int = 100, hi: int = 150):
    codes = rng.integers(0, 256, (rows, groups * 16), dtype=np.uint8)
    exps = rng.integers(lo, hi, (rows, groups), dtype=np.uint8)
    return codes, exps


def test_known_bytes():
    # byte 0x21: element 0 = low nibble 1 (0.5), element 1 = high nibble 2 (1.0)
    codes = np.zeros((1, 16), np.uint8)
    codes[0, 0], codes[0, 1], codes[0, 15] = 0x21, 0xF9, 0x07
    w = dequantize(codes, np.array([[128]], np.uint8))  # scale 2
    assert w.shape == (1, 32) and w.dtype == np.float32
    assert w[0, :4].tolist() == [1.0, 2.0, -1.0, -12.0]
    assert w[0, 30:].tolist() == [12.0, 0.0]


def test_every_code_and_exponent_exact_against_the_format():
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16).repeat(1, 0)
    for exp in (0, 1, 100, 127, 200, 252):
        w = dequantize(codes, np.full((16, 1), exp, np.uint8))
        for r in range(16):
            for c in range(32):
                byte = int(codes[r, c // 2])
                code = byte & 0xF if c % 2 == 0 else byte >> 4
                assert Fraction(float(w[r, c])) == _by_hand(code, exp), (r, c, exp)


@pytest.mark.parametrize("lo,hi", [(100, 150), (0, 8), (245, 253)])
def test_against_transformers_gpt_oss(lo, hi):
    rng = np.random.default_rng(lo)
    experts, rows, groups = 3, 5, 4
    codes, exps = _random(rng, experts * rows, groups, lo, hi)
    blocks = torch.from_numpy(codes.reshape(experts, rows, groups, 16))
    scales = torch.from_numpy(exps.reshape(experts, rows, groups))
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    # transformers hands gpt-oss [E, in, out]; the stored matrix is [E, out, in]
    want = ref.transpose(1, 2).numpy()
    if not np.isfinite(want).all():  # exponents 253/254 overflow for large codes: refused
        with pytest.raises(Mxfp4Error, match="overflows float32"):
            dequantize(codes, exps)
        return
    got = dequantize(codes, exps).reshape(experts, rows, groups * 32)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 stays -0.0


def test_encode_round_trip():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((6, 64)) * 0.02).astype(np.float32)
    codes, exps = encode(w)
    back = dequantize(codes, exps)
    # re-encoding the decoded values gives the same values back (MXFP4 is a fixed point)
    np.testing.assert_array_equal(dequantize(*encode(back)), back)
    scale = np.repeat(np.ldexp(1.0, exps.astype(int) - 127), 32, axis=1)
    # nearest FP4 value (spacing at most 2 scale units), the group maximum saturating at 6
    assert np.all(np.abs(back - w) <= 2 * scale)


def test_hostile_scales():
    codes = np.full((2, 32), 0x77, np.uint8)  # 6.0 everywhere
    exps = np.full((2, 2), 127, np.uint8)
    exps[1, 1] = 255
    with pytest.raises(Mxfp4Error, match="row 1 group 1: scale byte 255 is E8M0's NaN"):
        dequantize(codes, exps, "x")
    exps[1, 1] = 253
    with pytest.raises(Mxfp4Error, match=r"row 1 group 1: scale 2\^126 overflows"):
        dequantize(codes, exps, "x")
    with pytest.raises(Mxfp4Error, match="code bytes per row"):
        dequantize(codes[:, :20], exps[:, :1])
    # a zero code with the largest finite exponent is fine
    assert dequantize(np.zeros((1, 16), np.uint8), np.array([[254]], np.uint8)).max() == 0


def test_layout_from_config():
    assert layout_from_config({}) is None
    assert layout_from_config({"quantization_config": {"quant_method": "mxfp4"}}) == GPT_OSS
    assert layout_from_config({"quantization_config": CT_CONFIG}) == COMPRESSED
    nested = {"text_config": {"quantization_config": CT_CONFIG}}
    assert layout_from_config(nested) == COMPRESSED
    int4 = json.loads(json.dumps(CT_CONFIG))
    int4["format"] = "pack-quantized"
    int4["config_groups"]["group_0"]["weights"]["type"] = "int"
    assert layout_from_config({"quantization_config": int4}) is None
    bad = json.loads(json.dumps(CT_CONFIG))
    bad["config_groups"]["group_0"]["weights"]["group_size"] = 16
    with pytest.raises(Mxfp4Error, match="group_size 16 are not MXFP4"):
        layout_from_config({"quantization_config": bad})


def _write(d: Path, tensors: dict, quant: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": quant}))
    return d


def test_checkpoint_reads_both_layouts(tmp_path):
    rng = np.random.default_rng(7)
    codes, exps = _random(rng, 4 * 6, 3)
    want = dequantize(codes, exps)
    gpt = _write(tmp_path / "gpt", {"m.experts.down_proj_blocks": codes.reshape(4, 6, 3, 16),
                                    "m.experts.down_proj_scales": exps.reshape(4, 6, 3),
                                    "m.norm.weight": np.ones(3, np.float32)},
                 {"quant_method": "mxfp4"})
    ck = Checkpoint(gpt)
    assert ck.info("m.experts.down_proj").shape == (4, 6, 96)
    fused = SourceRef("m.experts.down_proj", 2, (1, 5))
    assert ck.ref_shape(fused) == (4, 96)
    np.testing.assert_array_equal(ck.read(fused), want.reshape(4, 6, 96)[2, 1:5])
    np.testing.assert_array_equal(ck.read(SourceRef("m.experts.down_proj")),
                                  want.reshape(4, 6, 96))
    ct = _write(tmp_path / "ct", {"m.w1.weight_packed": codes,
                                  "m.w1.weight_scale": exps}, CT_CONFIG)
    ck = Checkpoint(ct)
    np.testing.assert_array_equal(ck.read(SourceRef("m.w1.weight")), want)
    np.testing.assert_array_equal(ck.read(SourceRef("m.w1.weight", rows=(3, 9))), want[3:9])


@pytest.mark.parametrize("tensors,message", [
    ({"a.weight_packed": np.zeros((4, 16), np.uint8)}, "without their scales 'a.weight_scale'"),
    ({"a.weight_packed": np.zeros((4, 16), np.uint8),
      "a.weight_scale": np.zeros((4, 2), np.uint8)}, r"codes \[4, 16\] and scales \[4, 2\]"),
    ({"a.weight_packed": np.zeros((4, 16), np.int32),
      "a.weight_scale": np.zeros((4, 1), np.uint8)}, "must be U8/I8 and scales U8/F8_E8M0"),
    ({"a.weight_packed": np.zeros((4, 16), np.uint8), "a.weight_scale": np.zeros((4, 1), np.uint8),
      "a.weight": np.zeros((4, 32), np.float32)}, "the checkpoint also has 'a.weight'"),
])
def test_checkpoint_refuses_bad_tensors(tmp_path, tensors, message):
    with pytest.raises(SourceError, match=message) as e:
        Checkpoint(_write(tmp_path / "c", tensors, CT_CONFIG))
    assert "\n" not in str(e.value) and "model.safetensors" in str(e.value)


def test_checkpoint_names_a_nan_scale(tmp_path):
    exps = np.full((3, 1), 127, np.uint8)
    exps[2, 0] = 255
    ck = Checkpoint(_write(tmp_path / "c", {"a.weight_packed": np.zeros((3, 16), np.uint8),
                                            "a.weight_scale": exps}, CT_CONFIG))
    with pytest.raises(SourceError, match="model.safetensors: tensor 'a.weight': row 2 group 0"):
        ck.read(SourceRef("a.weight"))


@pytest.fixture(scope="module")
def mx_deepseek(tmp_path_factory) -> Path:
    """A tiny DeepSeek-V3 (hidden 64, experts 32 wide: whole MXFP4 groups) whose routed experts
    are stored as compressed-tensors MXFP4, as Kimi K3 stores them."""
    d = make_checkpoint("deepseek_v3", tmp_path_factory.mktemp("mx") / "src", hidden_size=64,
                        moe_intermediate_size=32, shard_size="200KB", tokenizer=False)
    for f in d.glob("*.safetensors"):
        tensors, changed = load_file(f), False
        for name in [n for n in tensors if ".mlp.experts." in n]:
            codes, exps = encode(tensors.pop(name).float().numpy())
            base = name.removesuffix("weight")
            tensors[base + "weight_packed"] = torch.from_numpy(codes)
            tensors[base + "weight_scale"] = torch.from_numpy(exps)
            changed = True
        if changed:
            save_torch(tensors, str(f))
    index = d / "model.safetensors.index.json"
    if index.exists():
        idx = json.loads(index.read_text())
        wmap = {}
        for name, f in idx["weight_map"].items():
            if ".mlp.experts." in name:
                base = name.removesuffix("weight")
                wmap[base + "weight_packed"] = wmap[base + "weight_scale"] = f
            else:
                wmap[name] = f
        idx["weight_map"] = wmap
        index.write_text(json.dumps(idx))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = CT_CONFIG
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_tiny_model_experts_read_exactly(mx_deepseek):
    ck = Checkpoint(mx_deepseek)
    a = adapter_for(ck.config)
    smap = bind(ck, a)
    raw = {}
    for f in ck.files:
        raw.update({k: v.numpy() for k, v in load_file(mx_deepseek / f).items()})
    layer = a.moe_layers()[-1]
    for part in ("gate", "up", "down"):
        ref = smap.expert(layer, 5, part)
        base = ref.name.removesuffix("weight")
        got = ck.read(ref)
        assert got.shape == a.expert_shape(part)
        np.testing.assert_array_equal(
            got, dequantize(raw[base + "weight_packed"], raw[base + "weight_scale"]))


def test_tiny_model_converts(mx_deepseek, tmp_path):
    """The converter takes MXFP4 experts; the container's (lossy, RVQ) experts follow the MXFP4
    values: a wrong nibble order or scale would leave them uncorrelated."""
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    out = tmp_path / "mx.moepack"
    convert(mx_deepseek, out, Settings(expert_preset="rvq3-baseline", iters=2))
    export(out, tmp_path / "hf")
    exported = {}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        exported.update(load_file(f))
    ck = Checkpoint(mx_deepseek)
    smap = bind(ck, adapter_for(ck.config))
    cosines = []
    for refs in smap.experts.values():
        for ref in refs.values():
            a, b = exported[ref.name].float().numpy().ravel(), ck.read(ref).ravel()
            cosines.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    assert len(cosines) == len(smap.experts) * 3 > 0
    assert min(cosines) > 0.9  # 0.991 measured (tiny random model, rvq3-baseline)


def test_convert_cli_names_a_nan_scale_in_one_line(mx_deepseek, tmp_path):
    """A damaged MXFP4 scale is a source error (SourceError, not a container FormatError):
    `convert` prints one line naming file and tensor and exits 1, as for other source errors."""
    import shutil

    from hostile_snapshot import assert_one_line_error
    from hostile_sources import convert_cli

    src = tmp_path / "src"
    shutil.copytree(mx_deepseek, src)
    f = next(f for f in sorted(src.glob("*.safetensors"))
             if any(n.endswith("weight_scale") for n in load_file(f)))
    tensors = load_file(f)
    name = next(n for n in sorted(tensors) if n.endswith("weight_scale"))
    tensors[name][0, 0] = 255  # E8M0's NaN
    save_torch(tensors, str(f))
    rc, output = convert_cli(src, tmp_path / "m.moepack", timeout=120)
    assert_one_line_error(rc, output, 1, f"{f.name}: tensor {name.removesuffix('_scale')!r}")
    assert "scale byte 255 is E8M0's NaN" in output
