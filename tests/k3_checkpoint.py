"""A tiny random Kimi K3-shaped checkpoint in the published layout (docs/K3.md; names and config
keys as llama.cpp's K3 converter reads them), written by hand rather than from moepack's adapter
so that the adapter is checked against it: `language_model.` prefix, Kimi-Linear KDA layers with
a full-rank `g_proj` and 1-D `A_log`, MLA layers with an output `g_proj`, a dense first layer,
latent MoE layers with MXFP4 routed experts (`w1`/`w2`/`w3` `.weight_packed` + `.weight_scale`),
AttnRes score pairs, a vision tower that must be skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from moepack.convert.mxfp4 import encode
from safetensors.numpy import save_file

# 4 layers: KDA, MLA, KDA, MLA (1-based full_attn_layers 2, 4); layer 0 dense; AttnRes blocks
# of 3 (banks at layers 0 and 3); hidden 40 (not a multiple of 32), experts at latent width 32
TEXT: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 50, "hidden_size": 40, "num_hidden_layers": 4, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 2, "v_head_dim": 4, "mla_use_nope": True,
    "linear_attn_config": {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 8,
                           "num_heads": 2, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0},
    "intermediate_size": 24, "first_k_dense_replace": 1, "moe_intermediate_size": 32,
    "routed_expert_hidden_size": 32, "num_experts": 5, "num_experts_per_token": 2,
    "num_shared_experts": 1, "moe_router_activation_func": "sigmoid", "moe_renormalize": True,
    "routed_scaling_factor": 2.5, "hidden_act": "situ", "activation_situ_beta": 3.0,
    "activation_situ_linear_beta": 0.0, "attn_res_block_size": 3, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2,
}
QUANT = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "float", "symmetric": True, "strategy": "group",
             "group_size": 32}}}}


def k3_tensors(t: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor of the text model (float32; routed experts MXFP4) and a vision stub."""
    rng = np.random.default_rng(seed)
    d, heads, la = t["hidden_size"], t["num_attention_heads"], t["linear_attn_config"]
    kd, qd = la["head_dim"], la["head_dim"] * la["num_heads"]
    nope, rope, vd = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    lat, inter, n_exp = (t["routed_expert_hidden_size"], t["moe_intermediate_size"],
                         t["num_experts"])
    out: dict[str, np.ndarray] = {}

    def w(name: str, *shape: int, scale: float = 0.2) -> None:
        out["language_model." + name] = (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str, n: int) -> None:
        out["language_model." + name] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w("model.embed_tokens.weight", t["vocab_size"], d)
    w("lm_head.weight", t["vocab_size"], d)
    norm("model.norm.weight", d)
    norm("model.output_attn_res_norm.weight", d)
    w("model.output_attn_res_proj.weight", d)
    full = {i - 1 for i in la["full_attn_layers"]}
    for i in range(t["num_hidden_layers"]):
        p = f"model.layers.{i}"
        norm(f"{p}.input_layernorm.weight", d)
        norm(f"{p}.post_attention_layernorm.weight", d)
        for res in ("self_attention_res", "mlp_res"):
            norm(f"{p}.{res}_norm.weight", d)
            w(f"{p}.{res}_proj.weight", d)
        a = f"{p}.self_attn"
        if i in full:
            w(f"{a}.q_a_proj.weight", t["q_lora_rank"], d)
            norm(f"{a}.q_a_layernorm.weight", t["q_lora_rank"])
            w(f"{a}.q_b_proj.weight", heads * (nope + rope), t["q_lora_rank"])
            w(f"{a}.kv_a_proj_with_mqa.weight", t["kv_lora_rank"] + rope, d)
            norm(f"{a}.kv_a_layernorm.weight", t["kv_lora_rank"])
            w(f"{a}.kv_b_proj.weight", heads * (nope + vd), t["kv_lora_rank"])
            w(f"{a}.g_proj.weight", heads * vd, d)
            w(f"{a}.o_proj.weight", d, heads * vd)
        else:
            for x in "qkv":
                w(f"{a}.{x}_proj.weight", qd, d)
                w(f"{a}.{x}_conv1d.weight", qd, 1, la["short_conv_kernel_size"])
            w(f"{a}.f_a_proj.weight", kd, d)
            w(f"{a}.f_b_proj.weight", qd, kd)
            w(f"{a}.b_proj.weight", la["num_heads"], d)
            w(f"{a}.A_log", la["num_heads"])
            w(f"{a}.dt_bias", qd)
            w(f"{a}.g_proj.weight", qd, d)
            norm(f"{a}.o_norm.weight", kd)
            w(f"{a}.o_proj.weight", d, qd)
        if i < t["first_k_dense_replace"]:
            for x, shape in (("gate", (t["intermediate_size"], d)),
                             ("up", (t["intermediate_size"], d)),
                             ("down", (d, t["intermediate_size"]))):
                w(f"{p}.mlp.{x}_proj.weight", *shape)
            continue
        m = f"{p}.block_sparse_moe"
        w(f"{m}.gate.weight", n_exp, d)
        w(f"{m}.gate.e_score_correction_bias", n_exp, scale=0.01)
        w(f"{m}.routed_expert_down_proj.weight", lat, d)
        w(f"{m}.routed_expert_up_proj.weight", d, lat)
        norm(f"{m}.routed_expert_norm.weight", lat)
        sh = inter * t["num_shared_experts"]
        for x, shape in (("gate", (sh, d)), ("up", (sh, d)), ("down", (d, sh))):
            w(f"{m}.shared_experts.{x}_proj.weight", *shape)
        for e in range(n_exp):
            for x, shape in (("w1", (inter, lat)), ("w3", (inter, lat)), ("w2", (lat, inter))):
                codes, scales = encode(rng.standard_normal(shape).astype(np.float32) * 0.2)
                base = f"language_model.{m}.experts.{e}.{x}.weight"
                out[base + "_packed"], out[base + "_scale"] = codes, scales
    out["vision_tower.encoder.blocks.0.wqkv.weight"] = np.zeros((6, 4), np.float32)
    out["mm_projector.proj.0.weight"] = np.zeros((4, 4), np.float32)
    return out


def make_k3_checkpoint(directory: Path, seed: int = 0, **text: Any) -> Path:
    """Write config.json and two safetensors shards (with their index) to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
           "text_config": {**TEXT, **text}, "quantization_config": QUANT,
           "vision_config": {"hidden_size": 4}}
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    tensors = k3_tensors(cfg["text_config"], seed)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(directory / fname))
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory
