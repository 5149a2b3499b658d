"""One table of bad model descriptions through both validators, so they cannot drift:

- Python: the converter's check (convert.plan.described, format/model_desc.py) raises a
  ConvertError naming config.json and the config key;
- C: the description the adapter builds from the same config, resealed into a container's
  manifest, is refused at open by the engine (runtime/src/model_config.c), naming the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from model_refusals import assert_refused_by_both, c_refusal, json_floats, reseal_model
from moepack.convert.adapters import adapter_for, base
from moepack.convert.errors import ConvertError
from moepack.convert.plan import described
from moepack.format.model_desc import INT_BOUNDS, ModelDescError, validate_model
from moepack.runtime.engine import Engine, EngineError, plan

TINY = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
CONFIGS: dict[str, dict[str, Any]] = {
    "mixtral": {**TINY, "architectures": ["MixtralForCausalLM"], "num_key_value_heads": 1,
                "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {**TINY, "architectures": ["Qwen3MoeForCausalLM"], "num_key_value_heads": 1,
                  "head_dim": 8, "moe_intermediate_size": 8, "num_experts": 4,
                  "num_experts_per_tok": 2, "intermediate_size": 16},
    "deepseek_v3": {**TINY, "architectures": ["DeepseekV3ForCausalLM"], "intermediate_size": 16,
                    "moe_intermediate_size": 8, "n_routed_experts": 8, "n_shared_experts": 1,
                    "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2,
                    "first_k_dense_replace": 1, "q_lora_rank": 8, "kv_lora_rank": 8,
                    "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4},
    "glm4_moe": {**TINY, "architectures": ["Glm4MoeForCausalLM"], "num_key_value_heads": 1,
                 "head_dim": 8, "intermediate_size": 16, "moe_intermediate_size": 8,
                 "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                 "first_k_dense_replace": 1, "attention_bias": True, "use_qk_norm": True,
                 "partial_rotary_factor": 0.5},
    "minimax_m2": {**TINY, "architectures": ["MiniMaxM2ForCausalLM"], "num_key_value_heads": 1,
                   "head_dim": 8, "rotary_dim": 4, "intermediate_size": 8,
                   "num_local_experts": 4, "num_experts_per_tok": 2},
}
CONFIGS["qwen3_next"] = {**CONFIGS["qwen3_moe"], "architectures": ["Qwen3NextForCausalLM"],
                         "shared_expert_intermediate_size": 8, "linear_num_key_heads": 2,
                         "linear_num_value_heads": 4, "linear_key_head_dim": 4,
                         "linear_value_head_dim": 4, "full_attention_interval": 2}
CONFIGS["kimi_k25"] = {"architectures": ["KimiK25ForConditionalGeneration"],
                       "text_config": CONFIGS["deepseek_v3"], "vision_config": {}}
NAN, INF = float("nan"), float("inf")

# (arch, config change, config key the converter names, field the engine names)
TABLE: list[tuple[str, dict[str, Any], str, str]] = [
    ("mixtral", {"num_experts_per_tok": 0}, "num_experts_per_tok", "moe.top_k"),
    ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok", "moe.top_k"),
    ("mixtral", {"num_local_experts": 0}, "num_local_experts", "moe.num_experts"),
    ("mixtral", {"num_hidden_layers": 0}, "num_hidden_layers", "num_layers"),
    ("mixtral", {"num_hidden_layers": 4097}, "num_hidden_layers", "num_layers"),
    ("mixtral", {"rope_theta": -1.0}, "rope_theta", "rope_theta"),
    ("mixtral", {"rope_theta": 0.5}, "rope_theta", "rope_theta"),
    ("mixtral", {"rope_theta": NAN}, "rope_theta", "rope_theta"),
    ("mixtral", {"rope_theta": INF}, "rope_theta", "rope_theta"),
    ("mixtral", {"rms_norm_eps": 0.0}, "rms_norm_eps", "rms_norm_eps"),
    ("mixtral", {"rms_norm_eps": -1e-6}, "rms_norm_eps", "rms_norm_eps"),
    ("mixtral", {"rms_norm_eps": 1.5}, "rms_norm_eps", "rms_norm_eps"),
    ("mixtral", {"rms_norm_eps": INF}, "rms_norm_eps", "rms_norm_eps"),
    ("mixtral", {"sliding_window": -1}, "sliding_window", "attention.sliding_window"),
    ("mixtral", {"sliding_window": 0}, "sliding_window", "attention.sliding_window"),
    ("mixtral", {"num_key_value_heads": 3, "num_attention_heads": 4}, "num_attention_heads",
     "num_attention_heads"),
    ("mixtral", {"head_dim": 7}, "head_dim", "head_dim"),
    ("mixtral", {"hidden_size": 4, "head_dim": 2}, "hidden_size", "hidden_size"),
    ("mixtral", {"hidden_size": (1 << 17) + 1}, "hidden_size", "hidden_size"),
    ("mixtral", {"vocab_size": 0}, "vocab_size", "vocab_size"),
    ("mixtral", {"vocab_size": (1 << 22) + 1}, "vocab_size", "vocab_size"),
    ("mixtral", {"intermediate_size": 0}, "intermediate_size", "moe.moe_intermediate_size"),
    ("mixtral", {"num_attention_heads": 4097}, "num_attention_heads", "num_attention_heads"),
    ("mixtral", {"max_position_embeddings": 0}, "max_position_embeddings",
     "max_position_embeddings"),
    ("mixtral", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling",
     "rope_scaling"),
    ("qwen3_moe", {"mlp_only_layers": [1], "intermediate_size": 0}, "intermediate_size",
     "dense_intermediate_size"),
    ("deepseek_v3", {"n_group": 3}, "n_group", "moe.n_group"),
    ("deepseek_v3", {"topk_group": 5}, "topk_group", "moe.topk_group"),
    ("deepseek_v3", {"num_experts_per_tok": 5}, "num_experts_per_tok", "moe.top_k"),
    ("deepseek_v3", {"routed_scaling_factor": 0.0}, "routed_scaling_factor",
     "moe.routed_scaling_factor"),
    ("deepseek_v3", {"routed_scaling_factor": -2.5}, "routed_scaling_factor",
     "moe.routed_scaling_factor"),
    ("deepseek_v3", {"qk_rope_head_dim": 3, "qk_nope_head_dim": 5}, "qk_rope_head_dim",
     "attention.qk_rope_head_dim"),
    ("deepseek_v3", {"qk_rope_head_dim": 1026}, "qk_rope_head_dim",
     "attention.qk_rope_head_dim"),
    ("deepseek_v3", {"kv_lora_rank": 0}, "kv_lora_rank", "attention.kv_lora_rank"),
    ("deepseek_v3", {"n_shared_experts": 1025}, "n_shared_experts", "moe.num_shared_experts"),
    ("deepseek_v3", {"rope_scaling": {"type": "yarn", "factor": -4.0}}, "rope_scaling.factor",
     "rope_scaling.factor"),
    ("deepseek_v3", {"rope_scaling": {"type": "yarn", "factor": 4.0, "attention_factor": 0}},
     "rope_scaling.attention_factor", "rope_scaling.attention_factor"),
    ("deepseek_v3", {"rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": -1.0}},
     "rope_scaling.mscale", "rope_scaling.mscale"),
    ("deepseek_v3", {"original_max_position_embeddings": 0,
                     "rope_scaling": {"type": "yarn", "factor": 4.0}},
     "original_max_position_embeddings", "rope_scaling.original_max_position_embeddings"),
    ("deepseek_v3", {"n_routed_experts": 65536, "num_hidden_layers": 18, "n_group": 1,
                     "topk_group": 1}, "n_routed_experts", "moe.num_experts"),
]
IDS = [f"{a}-{'-'.join(f'{k}={v}' for k, v in c.items())}"[:60] for a, c, _, _ in TABLE]


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_the_base_descriptions_pass_both(tmp_path: Path, arch: str) -> None:
    """The control: each base config passes Python, and C parses its description (any later
    refusal concerns the base container's tensors, not manifest.model)."""
    adapter = described(CONFIGS[arch])
    try:
        plan(str(reseal_model(tmp_path, adapter.model, adapter.config)))
    except EngineError as e:
        assert "manifest.model" not in str(e)


@pytest.mark.parametrize("arch,change,key,field", TABLE, ids=IDS)
def test_both_validators_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str,
                                change: dict, key: str, field: str) -> None:
    config = {**CONFIGS[arch], **change}
    with pytest.raises(ConvertError) as py:
        described(config)
    assert str(py.value).startswith(f"config.json: '{key}'"), py.value
    # The description the converter would have written had it not refused (its early bounds,
    # checked while reading config.json, relaxed): refused by the shared rules and by C.
    monkeypatch.setattr(base, "INT_BOUNDS", {})
    monkeypatch.setattr(base, "SOURCE_INT_BOUNDS", {})
    model = adapter_for(config).model
    with pytest.raises(ModelDescError) as d:
        validate_model(model)
    assert d.value.field == field
    msg = c_refusal(reseal_model(tmp_path, model, config))
    if all(math.isfinite(v) for v in json_floats(model)):  # else not JSON: refused before that
        assert "manifest.model: " in msg and field in msg, msg


def test_bounds_are_the_engines(tmp_path: Path) -> None:
    """Each integer bound: the value at the limit passes C's field check, one past it fails,
    for the top-level fields (the others share the code path)."""
    model = described(CONFIGS["mixtral"]).model
    for field in ("vocab_size", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        hi = INT_BOUNDS[field][1]
        over = {**model, field: hi + 1}
        assert field in c_refusal(reseal_model(tmp_path, over, {}))
        at = {**model, field: hi, "head_dim": 2, "num_key_value_heads": 1}
        try:
            plan(str(reseal_model(tmp_path, at, {})))
        except EngineError as e:
            assert field not in str(e), e


def test_engine_open_refuses_too(tmp_path: Path) -> None:
    model = {**described(CONFIGS["mixtral"]).model, "rope_theta": -1.0}
    with pytest.raises(EngineError, match="manifest.model: rope_theta must be a finite number"):
        Engine(str(reseal_model(tmp_path, model, {})), threads=1)


# (arch, description change under manifest.model.attention, field both validators name)
ATTENTION_TABLE: list[tuple[str, dict[str, Any], str]] = [
    ("glm4_moe", {"rotary_dim": 3}, "attention.rotary_dim"),
    ("glm4_moe", {"rotary_dim": 10}, "attention.rotary_dim"),  # > head_dim 8
    ("glm4_moe", {"rotary_dim": 0}, "attention.rotary_dim"),
    ("glm4_moe", {"qkv_bias": "yes"}, "attention.qkv_bias"),
    ("minimax_m2", {"qk_norm_scope": "layer"}, "attention.qk_norm_scope"),
    ("kimi_k25", {"rope_interleave": 1}, "attention.rope_interleave"),
    ("qwen3_next", {"output_gate": "yes"}, "attention.output_gate"),
]

# (description change under manifest.model: key -> value, or "key.sub" -> value; field named)
HYBRID_TABLE: list[tuple[dict[str, Any], str]] = [
    ({"rms_norm_unit_offset": 1}, "rms_norm_unit_offset"),
    ({"layer_attention": ["linear"]}, "layer_attention"),
    ({"layer_attention": ["linear", "mamba"]}, "layer_attention[1]"),
    ({"linear_attention": None}, "linear_attention"),
    ({"linear_attention.kind": "mamba2"}, "linear_attention.kind"),
    ({"linear_attention.projection": "fused"}, "linear_attention.projection"),
    ({"linear_attention.num_key_heads": 0}, "linear_attention.num_key_heads"),
    ({"linear_attention.num_value_heads": 3}, "linear_attention.num_value_heads"),
    ({"linear_attention.key_head_dim": 4097}, "linear_attention.key_head_dim"),
    ({"linear_attention.value_head_dim": 0}, "linear_attention.value_head_dim"),
    ({"linear_attention.conv_kernel_size": 65}, "linear_attention.conv_kernel_size"),
    ({"moe.shared_expert_gate": "on"}, "moe.shared_expert_gate"),
    ({"moe.num_shared_experts": 0}, "moe.shared_expert_gate"),
]


@pytest.mark.parametrize("change,field", HYBRID_TABLE, ids=[f for _, f in HYBRID_TABLE])
def test_linear_attention_fields_refused_by_both(tmp_path: Path, change: dict,
                                                 field: str) -> None:
    adapter = described(CONFIGS["qwen3_next"])
    assert_refused_by_both(tmp_path, adapter.model, adapter.config, change, field)


@pytest.mark.parametrize("arch,change,field", ATTENTION_TABLE,
                         ids=[f"{a}-{c}" for a, c, _ in ATTENTION_TABLE])
def test_attention_variants_refused_by_both(tmp_path: Path, arch: str, change: dict,
                                            field: str) -> None:
    adapter = described(CONFIGS[arch])
    attention = {f"attention.{k}": v for k, v in change.items()}
    assert_refused_by_both(tmp_path, adapter.model, adapter.config, attention, field)


# (description change under manifest.model: "rope_scaling" or "rope_scaling.KEY" -> value; field)
ROPE_TABLE: list[tuple[dict[str, Any], str]] = [
    ({"rope_scaling": [4.0]}, "rope_scaling"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),  # the source's spelling
    ({"rope_scaling.rope_type": "linear"}, "rope_scaling"),
    ({"rope_scaling.factor": None}, "rope_scaling.factor"),  # required
    ({"rope_scaling.factor": 0}, "rope_scaling.factor"),
    ({"rope_scaling.beta_fast": 0}, "rope_scaling.beta_fast"),
    ({"rope_scaling.beta_slow": -1.0}, "rope_scaling.beta_slow"),
    ({"rope_scaling.mscale": -0.5}, "rope_scaling.mscale"),
    ({"rope_scaling.mscale_all_dim": "1"}, "rope_scaling.mscale_all_dim"),
    ({"rope_scaling.attention_factor": 0}, "rope_scaling.attention_factor"),
    ({"rope_scaling.original_max_position_embeddings": 0},
     "rope_scaling.original_max_position_embeddings"),
]
YARN_SOURCE = {**CONFIGS["deepseek_v3"], "rope_scaling": {
    "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
    "mscale_all_dim": 1.0}}


def test_yarn_base_description_passes_both(tmp_path: Path) -> None:
    adapter = described(YARN_SOURCE)
    try:
        plan(str(reseal_model(tmp_path, adapter.model, adapter.config)))
    except EngineError as e:
        assert "manifest.model" not in str(e)


@pytest.mark.parametrize("change,field", ROPE_TABLE, ids=[str(c) for c, _ in ROPE_TABLE])
def test_rope_scaling_refused_by_both(tmp_path: Path, change: dict, field: str) -> None:
    adapter = described(YARN_SOURCE)
    assert_refused_by_both(tmp_path, adapter.model, adapter.config, change, field)
