"""The Kimi K3 converter adapter: the published config (docs/configs/Kimi-K3.json) described and
planned, a tiny K3-shaped checkpoint in the real layout (tests/k3_checkpoint.py) bound tensor by
tensor and converted, and clear refusals for configs that are not K3's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from k3_checkpoint import make_k3_checkpoint
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import SourceError
from moepack.convert.mapping import bind
from moepack.convert.mxfp4 import dequantize
from moepack.convert.plan import described, plan_for_config
from moepack.convert.settings import Settings
from moepack.convert.source import Checkpoint
from safetensors.numpy import load_file

CONFIG = Path(__file__).resolve().parent.parent / "docs" / "configs" / "Kimi-K3.json"


def test_published_config_describes_k3():
    a = described(json.loads(CONFIG.read_text()))
    m = a.model
    assert m["arch"] == "kimi_k3" and m["num_layers"] == 93
    assert m["layer_attention"].count("linear") == 69 and m["layer_attention"][3] == "full"
    assert m["layer_kinds"] == ["dense"] + ["moe"] * 92
    assert (m["moe"]["num_experts"], m["moe"]["top_k"], m["moe"]["latent_size"]) == (896, 16,
                                                                                      3584)
    assert m["moe"]["shared_intermediate_size"] == 2 * m["moe"]["moe_intermediate_size"]
    assert m["activation"]["kind"] == "situ" and m["attn_res"] == {"block_size": 12}
    assert m["linear_attention"]["gate_lower_bound"] == -5.0
    assert m["attention"]["rope"] is False and m["attention"]["output_gate"] is True
    assert a.expert_shape("gate") == (3072, 3584) and a.expert_shape("down") == (3584, 3072)
    assert any("vision tower" in s for s in a.skipped())


def test_published_config_plans_latent_expert_records():
    layout = plan_for_config(json.loads(CONFIG.read_text()), Settings())
    bank = layout.spec.banks[0]
    assert [p.shape for p in bank.parts] == [(3072, 3584), (3072, 3584), (3584, 3072)]
    assert len(layout.spec.banks) == 92
    # smaller than the MXFP4 source's 17,547,264 bytes per expert at the default codec
    assert layout.bank(bank.layer).record_length < 17_547_264
    assert layout.file_size > 92 * 896 * layout.bank(bank.layer).record_length


@pytest.fixture(scope="module")
def k3(tmp_path_factory) -> Path:
    return make_k3_checkpoint(tmp_path_factory.mktemp("k3") / "src")


def test_tiny_checkpoint_binds_every_tensor(k3):
    ck = Checkpoint(k3)
    a = adapter_for(ck.config)
    smap = bind(ck, a)
    used = {ref.name for _, ref in smap.trunk}
    used |= {ref.name for refs in smap.experts.values() for ref in refs.values()}
    # every text-model tensor is used (MXFP4 experts through their dequantised names)
    stored = {n for n in ck.tensors if n.startswith("language_model.")
              and not n.endswith(("_packed", "_scale"))}
    assert stored - used == set()
    names = {t.name for t, _ in smap.trunk}
    assert {"layers.1.attn.gate", "layers.0.linear.g", "layers.2.latent_down",
            "layers.2.latent_norm", "layers.3.ffn_res_proj", "final_res_norm"} <= names
    assert not any(n.endswith((".g_a", ".g_b")) for n in names)
    raw = {}
    for f in ck.files:
        raw.update(load_file(k3 / f))
    ref = smap.expert(3, 4, "down")
    base = ref.name.removesuffix("weight")
    np.testing.assert_array_equal(ck.read(ref), dequantize(raw[base + "weight_packed"],
                                                           raw[base + "weight_scale"]))


def _names(directory: Path) -> set[str]:
    out: set[str] = set()
    for f in directory.glob("*.safetensors"):
        out |= set(load_file(f))
    return out


def test_tiny_checkpoint_converts_and_exports_the_published_names(k3, tmp_path):
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.format import Container

    out = tmp_path / "k3.moepack"
    convert(k3, out, Settings(expert_preset="rvq3-baseline", iters=2))
    with Container.open(out) as c:
        model = c.manifest["model"]
        assert model["arch"] == "kimi_k3" and model["moe"]["latent_size"] == 32
        assert c.manifest["source"]["architecture"] == "KimiK3ForConditionalGeneration"
        assert any("vision tower" in s for s in c.manifest["source"]["skipped"])
    export(out, tmp_path / "hf")
    # the export is the checkpoint's text model, experts dequantised under their own names
    want = {n.removesuffix("_packed") for n in _names(k3)
            if n.startswith("language_model.") and not n.endswith("_scale")}
    assert _names(tmp_path / "hf") == want
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["text_config"]["hidden_act"] == "situ"
    again = Checkpoint(tmp_path / "hf")
    bind(again, adapter_for(again.config))  # and it converts again


@pytest.mark.parametrize("change,message", [
    ({"hidden_act": "silu"}, "hidden_act 'silu' is not Kimi K3's"),
    ({"mla_use_nope": False}, "mla_use_nope must be true"),
    ({"attn_res_block_size": None}, "attn_res_block_size"),
    ({"routed_expert_hidden_size": 0}, "routed_expert_hidden_size"),
    ({"activation_situ_beta": -1.0}, "activation_situ_beta"),
])
def test_refusals_name_the_key(change, message):
    cfg = json.loads(CONFIG.read_text())
    cfg["text_config"].update(change)
    cfg["text_config"] = {k: v for k, v in cfg["text_config"].items() if v is not None}
    with pytest.raises(SourceError, match=message) as e:
        described(cfg)
    assert "\n" not in str(e.value)


def test_positive_gate_bound_is_refused():
    cfg = json.loads(CONFIG.read_text())
    cfg["text_config"]["linear_attn_config"]["gate_lower_bound"] = 5.0
    with pytest.raises(SourceError, match="gate_lower_bound"):
        described(cfg)
