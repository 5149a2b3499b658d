"""GLM-5.3-Flash (transformers' `glm5_next`): a tiny random checkpoint built with transformers,
converted by the real converter and exported back. What is checked here is the converter side
(convert/adapters/glm5_next.py, FORMAT.md §7.2): the normalised description, every text tensor
under its canonical name, the export loading in transformers with the container's weights, and
bad configs refused in one line. The engine does not run `glm5_next` yet (hyper-connections,
the k-pool indexer and clamped SwiGLU are not in runtime/src): it must refuse it clearly.

Awkward sizes: hidden 36, KDA 2 heads of 10, indexer 4 heads of 12 with pools of 4, 6 experts in
2 groups, top-3; layers linear, DSA, linear, DSA with the second DSA layer running its own
indexer and a dense first layer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import SourceError
from moepack.format.model_desc import ModelDescError, validate_model
from moepack.format.reader import Container
from tiny_models import write_tokenizer

_TEXT = dict(vocab_size=67, hidden_size=36, intermediate_size=24, moe_intermediate_size=12,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
             n_routed_experts=6, n_shared_experts=1, num_experts_per_tok=3, n_group=2,
             topk_group=1, q_lora_rank=10, kv_lora_rank=8, qk_nope_head_dim=6,
             qk_rope_head_dim=0, v_head_dim=6, index_n_heads=4, index_head_dim=12,
             index_topk=8, index_kpool=4, linear_num_heads=2, linear_head_dim=10,
             hc_mult=4, hc_sinkhorn_iters=7, max_position_embeddings=128,
             mlp_layer_types=["dense", "sparse", "sparse", "sparse"], swiglu_limit=0.5,
             linear_lower_bound=-3.0, routed_scaling_factor=1.5, pad_token_id=0,
             layer_types=["linear_attention", "indexed_attention"] * 2,
             index_topk_pattern="FFSF")
_VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=36,
               projection_intermediate_size=16)


def _config(**text):
    from transformers import Glm5NextConfig

    return Glm5NextConfig(text_config={**_TEXT, **text}, vision_config=_VISION)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Source checkpoint (random weights, random norms), container, export."""
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from transformers import Glm5NextForConditionalGeneration

    d = tmp_path_factory.mktemp("glm5_next")
    torch.manual_seed(0)
    model = Glm5NextForConditionalGeneration(_config())
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(d / "src")
    write_tokenizer(d / "src", 67)
    convert(d / "src", d / "m.moepack", Settings())
    export(d / "m.moepack", d / "hf")
    return d


def _source_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_description_normalises_glm5_next(built):
    with Container.open(built / "m.moepack") as c:
        m = c.manifest["model"]
        skipped = c.manifest["source"].get("skipped", [])
    assert m["arch"] == "glm5_next"
    assert m["layer_attention"] == ["linear", "full", "linear", "full"]
    assert m["layer_kinds"] == ["dense", "moe", "moe", "moe"]
    a = m["attention"]
    assert (a["qk_rope_head_dim"], a["rope"], m["head_dim"]) == (0, False, 6)
    assert a["latent_norm_eps"] == m["rms_norm_eps"]
    # layer 2 is linear (no indexer), so layer 3 must run its own: "shared" there is refused
    assert a["dsa"]["indexer_types"] == ["full"] * 4
    assert (a["dsa"]["kpool"], a["dsa"]["kpool_select_tail"]) == (4, True)
    assert m["linear_attention"]["gate_lower_bound"] == -3.0
    assert m["swiglu_limit"] == 0.5
    assert m["hyper_connections"] == {"mult": 4, "eps": 1e-6, "sinkhorn_iters": 7}
    assert m["moe"]["routed_scaling_factor"] == 1.5
    assert any("vision" in s for s in skipped)


def test_every_text_tensor_is_carried(built):
    src = _source_tensors(built / "src")
    text = {n for n in src if not n.startswith("model.visual.")
            and ".mlp.experts." not in n}
    adapter = adapter_for(json.loads((built / "src" / "config.json").read_text()))
    mapped = {t.sources[0]: t for t in adapter.trunk()}
    assert set(mapped) == text
    with Container.open(built / "m.moepack") as c:
        for native, t in mapped.items():
            got = c.tensor(t.name)
            want = src[native].float().numpy().reshape(got.shape)
            if t.cls in ("norm", "bias", "router"):  # kept f32: exact
                np.testing.assert_array_equal(got, want, err_msg=t.name)
            else:
                err = np.abs(got - want).max() / np.abs(want).max()
                assert err < 0.05, (t.name, err)


def test_export_loads_in_transformers_with_the_containers_weights(built):
    from transformers import Glm5NextForConditionalGeneration

    model, info = Glm5NextForConditionalGeneration.from_pretrained(
        built / "hf", dtype=torch.float32, output_loading_info=True)
    assert not [k for k in info["missing_keys"] if not k.startswith("model.visual.")]
    assert not info["unexpected_keys"]
    params = dict(model.named_parameters())
    with Container.open(built / "m.moepack") as c:
        adapter = adapter_for(c.manifest["source"]["config"])
        for t in adapter.trunk():
            mem = t.sources[-1] if t.sources[-1] in params else t.sources[0]
            if mem not in params:  # stacked in memory (the q/k/v convs)
                continue
            np.testing.assert_array_equal(params[mem].detach().numpy().reshape(-1),
                                          c.tensor(t.name).reshape(-1), err_msg=t.name)
    with torch.no_grad():
        logits = model(torch.tensor([[3, 5, 7, 11, 13, 2, 4, 6] * 3])).logits
    assert logits.shape == (1, 24, 67) and torch.isfinite(logits).all()


def test_in_memory_names_give_the_same_container(built, tmp_path):
    """transformers' in-memory names (fused experts, stacked q/k/v conv, `forget_gate.*`,
    `attn_hc.*`) read as the saved ones."""
    import shutil

    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from safetensors.torch import save_file
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForConditionalGeneration.from_pretrained(built / "src", dtype=torch.float32)
    mem = tmp_path / "mem"
    mem.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.language_model.layers.0.self_attn.conv1d.weight" in state
    save_file(state, mem / "model.safetensors", metadata={"format": "pt"})
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(built / "src" / f, mem / f)
    convert(mem, tmp_path / "m.moepack", Settings())
    with Container.open(built / "m.moepack") as a, Container.open(tmp_path / "m.moepack") as b:
        assert a.tensor_names() == b.tensor_names()
        for name in a.tensor_names():
            np.testing.assert_array_equal(a.tensor(name), b.tensor(name), err_msg=name)
        for layer in (1, 2, 3):
            np.testing.assert_array_equal(a.expert_part(layer, 5, "up"),
                                          b.expert_part(layer, 5, "up"))


def test_engine_refuses_glm5_next_in_one_line(built):
    from moepack.runtime.engine import Engine

    with pytest.raises(Exception) as e:
        Engine(str(built / "m.moepack"))
    msg = str(e.value)
    assert "glm5_next" in msg and "not supported" in msg and "\n" not in msg


def _adapter(**text) -> object:
    cfg = _config(**text).to_dict()
    cfg["architectures"] = ["Glm5NextForConditionalGeneration"]
    return adapter_for(cfg)


@pytest.mark.parametrize("text, words", [
    (dict(qk_rope_head_dim=2), "qk_rope_head_dim must be 0"),
    (dict(index_topk_pattern="FSFS"), "indexer_types[1] is shared"),
    (dict(layer_types=["linear_attention", "sliding"] * 2), "layer_types must list"),
    (dict(linear_lower_bound=1.0), "linear_lower_bound must be a number < 0"),
    (dict(hc_mult=17), "'text_config.hc_mult' must be an integer in 1..16"),
    (dict(hc_sinkhorn_iters=0), "'text_config.hc_sinkhorn_iters' must be an integer in 1..1000"),
])
def test_bad_source_config_is_refused_in_one_line(text, words):
    cfg = _config().to_dict()
    cfg["architectures"] = ["Glm5NextForConditionalGeneration"]
    cfg["text_config"].update(text)
    if "index_topk_pattern" in text:
        cfg["text_config"].pop("indexer_types")
    with pytest.raises(SourceError) as e:
        _ = adapter_for(cfg).model
    assert words in str(e.value) and "\n" not in str(e.value)


def _good() -> dict:
    return json.loads(json.dumps(_adapter().model))


@pytest.mark.parametrize("path, value, words", [
    ("swiglu_limit", -1.0, "swiglu_limit: must be a finite number > 0"),
    ("hyper_connections.mult", 0, "hyper_connections.mult: must be an integer in 1..16"),
    ("hyper_connections.eps", 0.0, "hyper_connections.eps: must be a finite number in (0, 1)"),
    ("hyper_connections", [4], "hyper_connections: must be null or an object"),
    ("attention.dsa.kpool", 3, "attention.dsa.kpool: must divide index_topk (8)"),
    ("attention.dsa.kpool", 9, "attention.dsa.kpool: must be an integer in 1..8"),
    ("attention.dsa.kpool_select_tail", "yes", "attention.dsa.kpool_select_tail"),
    ("attention.qk_rope_head_dim", -2, "attention.qk_rope_head_dim: must be an integer in 0.."),
])
def test_bad_description_is_refused(path, value, words):
    m = _good()
    validate_model(m)
    *parents, key = path.split(".")
    obj = m
    for p in parents:
        obj = obj[p]
    obj[key] = value
    with pytest.raises(ModelDescError) as e:
        validate_model(m)
    assert words in str(e.value)


def test_rope_part_of_zero_is_glm5_next_only():
    m = _good()
    m["arch"] = "kimi_linear"
    with pytest.raises(ModelDescError) as e:
        validate_model(m)
    assert "attention.qk_rope_head_dim: must be an integer in 2.." in str(e.value)
