"""Adapters: canonical names, shapes and model descriptions for each architecture and layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
from moepack.convert.adapters import EXPERT_PARTS, adapter_for, supported
from moepack.convert.errors import SourceError, UnsupportedArchitecture
from moepack.convert.mapping import bind
from moepack.convert.source import Checkpoint
from tiny_models import ARCHS, make_checkpoint

MODEL_KEYS = {"arch", "vocab_size", "hidden_size", "num_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
              "max_position_embeddings", "tie_word_embeddings", "qk_norm", "attention",
              "layer_kinds", "dense_intermediate_size", "moe", "bos_token_id", "eos_token_id"}
MOE_KEYS = {"num_experts", "top_k", "moe_intermediate_size", "scoring", "norm_topk_prob",
            "n_group", "topk_group", "routed_scaling_factor", "num_shared_experts",
            "shared_intermediate_size"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {(arch, layout): make_checkpoint(arch, root / f"{arch}-{layout}", layout=layout)
            for arch in ARCHS for layout in ("hub", "fused")}


@pytest.mark.parametrize("arch", ARCHS)
def test_model_description_complete(ckpts, arch):
    a = adapter_for(Checkpoint(ckpts[(arch, "hub")]).config)
    # the optional keys of linear-attention hybrids (FORMAT.md §7)
    hybrid = {"rms_norm_unit_offset", "layer_attention", "linear_attention"}
    if arch == "kimi_linear":  # plain RMSNorms
        hybrid -= {"rms_norm_unit_offset"}
    assert set(a.model) == MODEL_KEYS | (hybrid if arch.startswith(("qwen3_", "kimi_linear"))
                                         and arch != "qwen3_moe" else set())
    assert set(a.model["moe"]) == MOE_KEYS | ({"shared_expert_gate"} if "layer_attention" in a.model
                                              and arch != "kimi_linear" else set())
    assert a.model["arch"] == arch
    json.dumps(a.model, allow_nan=False)  # must be canonical-JSON serialisable


def test_layer_kinds_and_routing(ckpts):
    mix = adapter_for(Checkpoint(ckpts[("mixtral", "hub")]).config).model
    assert mix["layer_kinds"] == ["moe", "moe"] and mix["moe"]["top_k"] == 1
    assert mix["moe"]["num_experts"] == 3 and mix["head_dim"] == 10
    qwen = adapter_for(Checkpoint(ckpts[("qwen3_moe", "hub")]).config).model
    assert qwen["layer_kinds"] == ["moe", "dense", "moe"]  # mlp_only_layers=[1]
    assert qwen["qk_norm"] and qwen["moe"]["top_k"] == 8 and qwen["moe"]["num_experts"] == 9
    ds = adapter_for(Checkpoint(ckpts[("deepseek_v3", "hub")]).config).model
    assert ds["layer_kinds"] == ["dense", "moe", "moe"]  # first_k_dense_replace=1
    assert ds["attention"]["kind"] == "mla" and ds["head_dim"] == 6
    assert ds["moe"]["scoring"] == "sigmoid" and ds["moe"]["n_group"] == 4
    assert ds["moe"]["routed_scaling_factor"] == 2.5 and ds["moe"]["shared_intermediate_size"] == 12


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", ["hub", "fused"])
def test_every_tensor_resolves(ckpts, arch, layout):
    ck = Checkpoint(ckpts[(arch, layout)])
    a = adapter_for(ck.config)
    smap = bind(ck, a)
    names = [t.name for t, _ in smap.trunk]
    assert names[0] == "embed" and names[-2:] == ["final_norm", "lm_head"]
    assert len(set(names)) == len(names)
    n_exp = a.model["moe"]["num_experts"]
    assert len(smap.experts) == n_exp * len(a.moe_layers())
    if arch == "deepseek_v3":
        assert {"layers.1.router_bias", "layers.1.shared.down", "layers.0.ffn.gate",
                "layers.1.attn.kv_b", "layers.1.attn.q_a_norm"} <= set(names)
    if arch == "qwen3_moe":
        assert {"layers.0.attn.q_norm", "layers.1.ffn.up"} <= set(names)
        assert "layers.1.router" not in names


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_and_hub_layouts_read_same_values(ckpts, arch):
    hub, fused = Checkpoint(ckpts[(arch, "hub")]), Checkpoint(ckpts[(arch, "fused")])
    a = adapter_for(hub.config)
    mh, mf = bind(hub, a), bind(fused, a)
    layer = a.moe_layers()[-1]
    for e in (0, a.model["moe"]["num_experts"] - 1):
        for part in EXPERT_PARTS:
            x, y = hub.read(mh.expert(layer, e, part)), fused.read(mf.expert(layer, e, part))
            assert x.shape == a.expert_shape(part)
            np.testing.assert_array_equal(x, y)
    if arch == "mixtral":  # fused spells the block `mlp`, the Hub `block_sparse_moe`
        assert mf.expert(0, 0, "gate").name == "model.layers.0.mlp.experts.gate_up_proj"
        assert mh.expert(0, 0, "gate").name == "model.layers.0.block_sparse_moe.experts.0.w1.weight"


SKIPPED_PREFIXES = {"kimi_k25": ("vision_tower.", "mm_projector.", "model.mm_projector."),
                    "qwen3_5_moe": ("model.visual.",)}


def test_native_names_are_what_save_pretrained_writes(ckpts):
    for arch in ARCHS:
        ck = Checkpoint(ckpts[(arch, "hub")])
        a = adapter_for(ck.config)
        written = set(n for n in ck.tensors)
        native = {t.sources[0] for t in a.trunk()}
        for layer in a.moe_layers():
            for e in range(a.model["moe"]["num_experts"]):
                native |= set(a.native_expert_names(layer, e).values())
        if arch in SKIPPED_PREFIXES:  # the skipped vision tower and projector, nothing else
            extra = written - native
            assert extra and all(n.startswith(SKIPPED_PREFIXES[arch]) for n in extra), extra
            written -= extra
        assert native == written, arch


def test_new_families_descriptions(ckpts):
    glm = adapter_for(Checkpoint(ckpts[("glm4_moe", "hub")]).config)
    m = glm.model
    assert m["layer_kinds"] == ["dense", "moe", "moe"] and m["qk_norm"] is True
    assert m["attention"] == {"kind": "gqa", "rotary_dim": 6, "qkv_bias": True}
    assert m["moe"]["scoring"] == "sigmoid" and m["moe"]["n_group"] == 2
    assert m["moe"]["routed_scaling_factor"] == 1.5 and m["moe"]["shared_intermediate_size"] == 12
    names = [t.name for t in glm.trunk()]
    assert names.index("layers.1.attn.o") + 1 == names.index("layers.1.attn.q_bias")
    assert {"layers.1.router_bias", "layers.1.shared.up", "layers.0.ffn.gate"} <= set(names)
    assert any("multi-token-prediction" in s for s in glm.skipped())

    mm = adapter_for(Checkpoint(ckpts[("minimax_m2", "hub")]).config)
    m = mm.model
    assert m["attention"] == {"kind": "gqa", "rotary_dim": 4, "qk_norm_scope": "all_heads"}
    assert m["moe"]["scoring"] == "sigmoid" and m["moe"]["n_group"] == 1
    assert m["moe"]["norm_topk_prob"] is True and m["moe"]["num_shared_experts"] == 0
    shapes = {t.name: t.shape for t in mm.trunk()}
    assert shapes["layers.0.attn.q_norm"] == (40,) and shapes["layers.0.attn.k_norm"] == (20,)
    assert shapes["layers.1.router_bias"] == (5,)

    kimi = adapter_for(Checkpoint(ckpts[("kimi_k25", "hub")]).config)
    m = kimi.model
    assert m["arch"] == "kimi_k25" and m["attention"]["kind"] == "mla"
    assert m["attention"]["rope_interleave"] is True and m["hidden_size"] == 28
    assert m["moe"]["routed_scaling_factor"] == 2.0
    assert any("vision tower" in s for s in kimi.skipped())
    srcs = {t.name: t.sources for t in kimi.trunk()}
    assert srcs["embed"] == ("language_model.model.embed_tokens.weight",
                             "model.language_model.embed_tokens.weight")
    assert srcs["lm_head"] == ("language_model.lm_head.weight", "lm_head.weight")


@pytest.mark.parametrize("arch,key,value,message", [
    ("glm4_moe", "partial_rotary_factor", 0.25, "partial rotary embedding over 3 of 12"),
    ("glm4_moe", "partial_rotary_factor", "half", "'partial_rotary_factor' must be a number"),
    ("minimax_m2", "rotary_dim", 5, "partial rotary embedding over 5 of 10"),
    ("minimax_m2", "scoring_func", "softmax", "scoring_func 'softmax' is not supported"),
    ("minimax_m2", "qk_norm_type", "per_head", "qk_norm_type 'per_head' is not supported"),
])
def test_new_families_refusals(ckpts, arch, key, value, message):
    cfg = dict(Checkpoint(ckpts[(arch, "hub")]).config)
    cfg.pop("rope_parameters", None)  # the classic keys, as in the Hub configs
    cfg[key] = value
    with pytest.raises(SourceError, match=message):
        _ = adapter_for(cfg).model


def test_kimi_text_config_errors_name_the_nested_key(ckpts):
    cfg = json.loads(json.dumps(Checkpoint(ckpts[("kimi_k25", "hub")]).config))
    cfg["text_config"]["hidden_size"] = "wide"
    with pytest.raises(SourceError, match="'text_config.hidden_size' must be a non-negative"):
        _ = adapter_for(cfg).model
    assert adapter_for({**cfg, "architectures": ["Kimi_K25ForConditionalGeneration"]}).arch \
        == "kimi_k25"
    with pytest.raises(SourceError, match="'text_config' must be an object"):
        adapter_for({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": 3})


def test_unsupported_architecture_lists_supported():
    with pytest.raises(UnsupportedArchitecture) as e:
        adapter_for({"architectures": ["LlamaForCausalLM"]})
    for name in supported():
        assert name in str(e.value)
    assert "LlamaForCausalLM" in str(e.value)


def test_rope_from_classic_keys_and_missing_key():
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2, "qk_nope_head_dim": 2,
           "qk_rope_head_dim": 2, "kv_lora_rank": 4, "v_head_dim": 2, "q_lora_rank": None,
           "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "max_position_embeddings": 32, "rope_theta": 50000,
           "rope_scaling": {"type": "yarn", "factor": 40}}
    m = adapter_for(cfg).model
    assert m["rope_theta"] == 50000.0 and m["rope_scaling"]["factor"] == 40
    assert m["attention"]["q_lora_rank"] is None
    assert "layers.0.attn.q" in [t.name for t in adapter_for(cfg).trunk()]
    del cfg["kv_lora_rank"]
    with pytest.raises(SourceError, match="kv_lora_rank"):
        _ = adapter_for(cfg).model


_DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
         "num_hidden_layers": 1, "num_attention_heads": 2, "qk_nope_head_dim": 2,
         "qk_rope_head_dim": 2, "kv_lora_rank": 4, "v_head_dim": 2, "q_lora_rank": None,
         "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
         "max_position_embeddings": 160}
YARN_KEYS = {"rope_type", "factor", "original_max_position_embeddings", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "attention_factor"}


@pytest.mark.parametrize("source, want", [
    # DeepSeek-V3's published object: `type`, not `rope_type`
    ({"rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4,
                       "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}},
     dict(factor=40, original_max_position_embeddings=4, beta_fast=32, beta_slow=1, mscale=1.0,
          mscale_all_dim=1.0, attention_factor=None)),
    # transformers' defaults written out: `or` for the betas and mscales, factor from the
    # positions when absent (transformers 5), keys it does not read dropped
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e4, "beta_fast": 0,
                          "original_max_position_embeddings": 40, "truncate": True,
                          "low_freq_factor": 9.0, "attention_factor": 1.25}},
     dict(factor=4.0, original_max_position_embeddings=40, beta_fast=32.0, beta_slow=1.0,
          mscale=0.0, mscale_all_dim=0.0, attention_factor=1.25)),
    # a top-level original_max_position_embeddings wins; none at all: max_position_embeddings
    ({"original_max_position_embeddings": 16,
      "rope_scaling": {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 8}},
     dict(factor=2, original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
          mscale=0.0, mscale_all_dim=0.0, attention_factor=None)),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2}},
     dict(factor=2, original_max_position_embeddings=160, beta_fast=32.0, beta_slow=1.0,
          mscale=0.0, mscale_all_dim=0.0, attention_factor=None)),
])
def test_rope_scaling_is_normalised(source, want):
    """The description holds exactly FORMAT.md §7's YaRN keys, never the source's object."""
    rs = adapter_for({**_DSV3, **source}).model["rope_scaling"]
    assert set(rs) == YARN_KEYS and rs == {"rope_type": "yarn", **want}


@pytest.mark.parametrize("scaling", [None, {"rope_type": "default", "factor": 8.0},
                                     {"type": "default"}])
def test_plain_rope_is_null(scaling):
    assert adapter_for({**_DSV3, "rope_scaling": scaling}).model["rope_scaling"] is None


def test_yarn_without_truncation_is_refused_in_one_line():
    cfg = {**_DSV3, "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": False}}
    with pytest.raises(SourceError, match=r"^config.json: 'rope_scaling.truncate' is false: "):
        _ = adapter_for(cfg).model


def test_qwen_decoder_sparse_step(tmp_path):
    ck = Checkpoint(make_checkpoint("qwen3_moe", tmp_path, decoder_sparse_step=2,
                                    mlp_only_layers=[], num_hidden_layers=4, tokenizer=False))
    a = adapter_for(ck.config)
    assert a.model["layer_kinds"] == ["dense", "moe", "dense", "moe"]
    bind(ck, a)


def test_tied_embeddings_have_no_lm_head(tmp_path):
    ck = Checkpoint(make_checkpoint("qwen3_moe", tmp_path, tie_word_embeddings=True,
                                    tokenizer=False))
    a = adapter_for(ck.config)
    assert a.model["tie_word_embeddings"] is True
    assert "lm_head" not in [t.name for t in a.trunk()]
    bind(ck, a)


def test_fused_expert_count_must_match_config(ckpts, tmp_path):
    import shutil

    src = tmp_path / "q"
    shutil.copytree(ckpts[("qwen3_moe", "fused")], src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_experts"] = 8  # the file holds 9
    (src / "config.json").write_text(json.dumps(cfg))
    ck = Checkpoint(src)
    with pytest.raises(SourceError, match=r"\[9, 36\], but config.json implies \[8, 36\]"):
        bind(ck, adapter_for(ck.config))  # the router notices first
    from moepack.convert.mapping import _check_fused_count

    refs = adapter_for(ck.config).expert_refs(0, 0, ck.tensors.keys())
    with pytest.raises(SourceError, match="gate_up_proj' holds 9 experts, but config.json says 8"):
        _check_fused_count(ck, refs, 8)


@pytest.mark.parametrize("key,value,message", [
    ("hidden_size", "wide", "'hidden_size' must be a non-negative integer"),
    ("num_local_experts", -3, "'num_local_experts' must be a non-negative integer"),
    ("rms_norm_eps", "tiny", "'rms_norm_eps' must be a number"),
])
def test_bad_config_values_are_named(ckpts, key, value, message):
    cfg = dict(Checkpoint(ckpts[("mixtral", "hub")]).config)
    cfg[key] = value
    with pytest.raises(SourceError, match=message):
        _ = adapter_for(cfg).model


def test_bad_routing_config_values(ckpts):
    ds = dict(Checkpoint(ckpts[("deepseek_v3", "hub")]).config, scoring_func="relu")
    with pytest.raises(SourceError, match="scoring_func 'relu' is not supported"):
        _ = adapter_for(ds).model
    qw = dict(Checkpoint(ckpts[("qwen3_moe", "hub")]).config, mlp_only_layers=3)
    with pytest.raises(SourceError, match="mlp_only_layers must be a list"):
        _ = adapter_for(qw).model
