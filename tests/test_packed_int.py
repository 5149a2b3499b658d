"""INT compressed-tensors `pack-quantized` weights (Kimi K2.5 experts): the bit layout written out
by hand from the format description, the reader against compressed-tensors' own packer and
decompressor (when installed), and the checkpoint reader on a tiny Kimi K2.5 checkpoint."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import SourceError
from moepack.convert.mapping import bind
from moepack.convert.packed_int import (
    PackedIntError,
    PackedScheme,
    dequantize,
    pack,
    packed_words,
    scheme_from_config,
    unpack,
)
from moepack.convert.source import Checkpoint
from safetensors.torch import load_file
from tiny_models import make_checkpoint


def _by_hand(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """The description, literally: element c = bits [c·B, c·B+B) of the row's little-endian
    stream of 32-bit words, minus 2^(B-1)."""
    out = np.zeros((words.shape[0], cols), np.int64)
    for r, row in enumerate(words):
        stream = 0
        for i, w in enumerate(row):
            stream |= (int(w) & 0xFFFFFFFF) << (32 * i)
        for c in range(cols):
            out[r, c] = ((stream >> (c * bits)) & ((1 << bits) - 1)) - (1 << (bits - 1))
    return out


def test_known_words():
    # 4 bits: eight nibbles per word, element 0 in the lowest nibble; stored offset by 8
    w = np.array([[0x76543210, 0x0000000F]], dtype=np.uint32).view(np.int32)
    assert unpack(w, 4, 9).tolist() == [[-8, -7, -6, -5, -4, -3, -2, -1, 7]]
    # a word whose top nibble is set is negative as int32: no sign smearing
    w = np.array([[0xF0000000]], dtype=np.uint32).view(np.int32)
    assert unpack(w, 4, 8).tolist() == [[-8] * 7 + [7]]
    # 8 bits: bytes, low byte first
    w = np.array([[0x80FF7F00]], dtype=np.uint32).view(np.int32)
    assert unpack(w, 8, 4).tolist() == [[-128, -1, 127, 0]]


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("cols", [1, 7, 28, 33, 64])
def test_pack_unpack_round_trip_and_by_hand(bits, cols):
    rng = np.random.default_rng(bits * 100 + cols)
    q = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (5, cols)).astype(np.int8)
    words = pack(q, bits)
    assert words.dtype == np.int32 and words.shape == (5, packed_words(cols, bits))
    np.testing.assert_array_equal(unpack(words, bits, cols), q)
    np.testing.assert_array_equal(_by_hand(words, bits, cols), q)


def test_dequantize_groups_and_channel():
    q = np.arange(-4, 4, dtype=np.int8).reshape(1, 8)
    s = np.array([[0.5, 2.0]], np.float32)
    assert dequantize(q, s, 4).tolist() == [[-2, -1.5, -1, -0.5, 0, 2, 4, 6]]
    assert dequantize(q, s[:, :1], None).tolist() == [[-2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5]]


def test_scheme_from_config():
    def cfg(**w):
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": 32, **w}
        return {"quantization_config": {"quant_method": "compressed-tensors",
                                        "format": "pack-quantized",
                                        "config_groups": {"g": {"weights": weights}}}}
    assert scheme_from_config(cfg()) == PackedScheme(4, 32)
    assert scheme_from_config(cfg(strategy="channel")) == PackedScheme(4, None)
    nested = {"text_config": cfg()}
    assert scheme_from_config(nested) == PackedScheme(4, 32)
    assert scheme_from_config({"quantization_config": {"quant_method": "fp8"}}) is None
    for bad, msg in ((dict(num_bits=3), "3 bits"), (dict(symmetric=False), "asymmetric"),
                     (dict(type="float"), "'float'"), (dict(strategy="tensor"), "'tensor'"),
                     (dict(actorder="group"), "actorder")):
        with pytest.raises(PackedIntError, match=msg):
            scheme_from_config(cfg(**bad))


def test_against_compressed_tensors():
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import (
        pack_to_int32,
        unpack_from_int32,
    )
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    rng = np.random.default_rng(7)
    for bits in (2, 4, 8):
        q = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (6, 40)).astype(np.int8)
        theirs = pack_to_int32(torch.from_numpy(q), bits).numpy()
        np.testing.assert_array_equal(theirs, pack(q, bits))
        np.testing.assert_array_equal(unpack(theirs, bits, 40), q)
        back = unpack_from_int32(torch.from_numpy(pack(q, bits)), bits, torch.Size((6, 40)))
        np.testing.assert_array_equal(back.numpy(), q)
    # the whole decompression, group size 8, f32 scales: identical
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                            group_size=8)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    q = rng.integers(-8, 8, (12, 40)).astype(np.int8)
    scale = rng.uniform(1e-3, 0.1, (12, 5)).astype(np.float32)
    w = torch.from_numpy(q.astype(np.float32) * np.repeat(scale, 8, axis=1))
    sd = PackedQuantizationCompressor.compress({"weight": w, "weight_scale":
                                                torch.from_numpy(scale)}, scheme)
    ours = dequantize(unpack(sd["weight_packed"].numpy(), 4, 40), scale, 8)
    want = PackedQuantizationCompressor.decompress(sd, scheme)["weight"].numpy()
    np.testing.assert_array_equal(ours, want)
    # bf16 scales: compressed-tensors rounds the product to bf16, ours is exact
    sb = torch.from_numpy(scale).to(torch.bfloat16)
    sd["weight_scale"] = sb
    want = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
    ours = dequantize(q, sb.float().numpy(), 8)
    assert torch.equal(torch.from_numpy(ours).to(torch.bfloat16), want)
    assert ct.__version__


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return make_checkpoint("kimi_k25", tmp_path_factory.mktemp("kimi") / "src", int4_group=4,
                           tokenizer=False)


def test_checkpoint_reads_int4_experts(kimi):
    ck = Checkpoint(kimi)
    a = adapter_for(ck.config)
    smap = bind(ck, a)
    raw = {}
    for f in ck.files:
        raw.update(load_file(kimi / f))
    layer = a.moe_layers()[-1]
    for part in ("gate", "down"):
        ref = smap.expert(layer, 3, part)
        base = ref.name.removesuffix("weight")
        words = raw[base + "weight_packed"].numpy()
        scale = raw[base + "weight_scale"].float().numpy()
        rows, cols = raw[base + "weight_shape"].tolist()
        want = _by_hand(words, 4, cols) * np.repeat(scale, 4, axis=1)
        got = ck.read(ref)
        assert got.shape == (rows, cols) == a.expert_shape(part)
        np.testing.assert_array_equal(got, want.astype(np.float32))
        band = ck.read(type(ref)(ref.name, rows=(2, 7)))
        np.testing.assert_array_equal(band, got[2:7])
    # the trunk (attention, shared expert, router) is plain bf16/f32 and read as before
    assert ck.info("language_model.model.layers.1.mlp.shared_experts.up_proj.weight").dtype \
        in ("F32", "BF16")


def _edit(src, tmp_path, edit_cfg=None, drop=None):
    dst = tmp_path / "edited"
    shutil.copytree(src, dst)
    if edit_cfg:
        cfg = json.loads((dst / "config.json").read_text())
        edit_cfg(cfg["text_config"]["quantization_config"]["config_groups"]["group_0"])
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_checkpoint_refusals(kimi, tmp_path):
    def three_bits(g):
        g["weights"]["num_bits"] = 3
    with pytest.raises(SourceError, match="3 bits are not supported"):
        Checkpoint(_edit(kimi, tmp_path, three_bits))

    def wrong_group(g):
        g["weights"]["group_size"] = 8  # the scales say 4
    with pytest.raises(SourceError, match="is not 4-bit groups of 8"):
        Checkpoint(_edit(kimi, tmp_path / "b", wrong_group))


def test_converted_kimi_says_what_it_skipped(kimi, tmp_path):
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from moepack.format import Container
    from moepack.format.info import container_info
    from typer.testing import CliRunner

    from moepack.cli import app

    out = tmp_path / "k.moepack"
    convert(kimi, out, Settings(expert_preset="rvq3-baseline", iters=2))
    with Container.open(out) as c:
        info = container_info(c)
        assert c.manifest["source"]["architecture"] == "KimiK25ForConditionalGeneration"
    assert info["arch"] == "kimi_k25" and len(info["skipped"]) == 2
    assert info["skipped"][0].startswith("vision tower and multimodal projector")
    shown = CliRunner().invoke(app, ["info", str(out)], terminal_width=200)
    assert shown.exit_code == 0 and "not converted" in shown.stdout
    assert "vision tower" in shown.stdout
