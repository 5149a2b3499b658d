"""`moepack export`: a dequantised Hugging Face checkpoint that transformers loads as is, whose
every tensor equals the codec decode of the container."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from moepack.convert.adapters import EXPERT_PARTS, adapter_for
from moepack.convert.errors import ConvertError
from moepack.convert.export import export
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from moepack.format import Container
from safetensors import safe_open
from tiny_models import ARCHS, make_checkpoint, model_class

FAST = Settings(expert_preset="rvq3-baseline", iters=3)
# One unusual source per architecture: fused experts (Qwen3), fp8 blocks (DeepSeek-V3,
# MiniMax-M2 as published), INT4 pack-quantized experts (Kimi K2.5 as published).
SOURCES = {"mixtral": {}, "qwen3_moe": {"layout": "fused"}, "deepseek_v3": {"fp8_block": (8, 8)},
           "glm4_moe": {}, "minimax_m2": {"fp8_block": (8, 8)}, "kimi_k25": {"int4_group": 4},
           "qwen3_next": {}, "qwen3_5_moe": {}, "kimi_linear": {}}
# Kimi K2.5's and Qwen3.5-MoE's exports carry the text model only: the vision tower stays missing
SKIPPED = ("model.vision_tower.", "model.mm_projector.", "model.visual.")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    out = {}
    for arch in ARCHS:
        src = make_checkpoint(arch, root / f"{arch}-src", **SOURCES[arch])
        path = root / f"{arch}.moepack"
        convert(src, path, FAST)
        hf = root / f"{arch}-hf"
        export(path, hf, shard_bytes=20_000)
        out[arch] = (src, path, hf)
    return out


def _fused_view(sd: dict, prefixes: tuple[str, ...], part: str, inter: int,
                expert: int) -> np.ndarray | None:
    """transformers 5 keeps experts fused in memory; pick one expert's projection out."""
    prefix = next(p for p in prefixes if p + ".experts.down_proj" in sd) + ".experts."
    if part == "down":
        return sd[prefix + "down_proj"][expert].numpy()
    rows = slice(0, inter) if part == "gate" else slice(inter, 2 * inter)
    return sd[prefix + "gate_up_proj"][expert][rows].numpy()


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_export_and_every_tensor_is_the_decode(exported, arch):
    src, path, hf = exported[arch]
    model, info = model_class(arch).from_pretrained(hf, output_loading_info=True)
    assert not info["unexpected_keys"]
    assert all(k.startswith(SKIPPED) for k in info["missing_keys"]), info["missing_keys"]
    assert bool(info["missing_keys"]) == (arch in ("kimi_k25", "qwen3_5_moe"))
    sd = {k: v.detach() for k, v in model.state_dict().items() if not k.startswith(SKIPPED)}
    with Container.open(path) as c:
        adapter = adapter_for(c.manifest["source"]["config"])
        checked = 0
        trunk_keys = set()
        for t in adapter.trunk():  # in memory, Mixtral says mlp.gate where the Hub says
            ref = adapter.resolve(t, sd.keys())  # block_sparse_moe.gate; Kimi-Linear stacks
            got = sd[ref.name].numpy()  # its q/k/v convs (a row range each)
            got = got[ref.rows[0]:ref.rows[1]] if ref.rows else got
            np.testing.assert_array_equal(got, c.tensor(t.name), t.name)
            trunk_keys.add(ref.name)
            checked += 1
        inter = adapter.model["moe"]["moe_intermediate_size"]
        for bank in c.banks():
            for e in range(bank["count"]):
                prefixes = adapter.moe_prefixes(bank["layer"])
                for part in EXPERT_PARTS:
                    want = c.expert_part(bank["layer"], e, part)
                    got = _fused_view(sd, prefixes, part, inter, e)
                    np.testing.assert_array_equal(got, want)
                    checked += 1
        fused = {k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))}
        assert len(fused) == 2 * len(c.banks())
        assert set(sd) == trunk_keys | fused
    assert checked == len(adapter.trunk()) + 3 * sum(b["count"] for b in c.banks())
    logits = model(torch.tensor([[1, 5, 7, 3]])).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_export_files(exported, arch):
    src, path, hf = exported[arch]
    cfg = json.loads((hf / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"
    assert "quantization_config" not in cfg.get("text_config", {})
    assert cfg["architectures"] == json.loads((src / "config.json").read_text())["architectures"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (hf / name).read_bytes() == (src / name).read_bytes()
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded as asked
    for name, fname in list(index["weight_map"].items())[:5]:
        with safe_open(hf / fname, "np") as f:
            assert name in f.keys()
    assert not (hf.parent / (hf.name + ".partial")).exists()


def test_bf16_export_and_refusals(exported, tmp_path):
    _, path, _ = exported["mixtral"]
    out = tmp_path / "bf"
    res = export(path, out, dtype="bf16")
    assert res["files"] == ["model.safetensors"]
    with Container.open(path) as c, safe_open(out / "model.safetensors", "pt") as f:
        got = f.get_tensor("model.layers.1.block_sparse_moe.experts.2.w2.weight")
        want = torch.from_numpy(c.expert_part(1, 2, "down")).to(torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    with pytest.raises(ConvertError, match="not empty; pass --force"):
        export(path, out)
    export(path, out, force=True)  # replaced in one rename
    with pytest.raises(ConvertError, match="unknown dtype"):
        export(path, tmp_path / "x", dtype="f8")
