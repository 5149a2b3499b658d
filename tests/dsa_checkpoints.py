"""Tiny random checkpoints of the DSA families, built with transformers (random norm weights):
DeepSeek-V3.2 / GLM-5 (`deepseek_v32`, `glm_moe_dsa`: tests/test_runtime_models_dsa.py) and
GLM-5.3-Flash (`glm5_next`: tests/test_runtime_models_glm5_next.py), and the configs they come
from; shared with tests/tiny_containers.py and tests/test_mtp.py."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_models import write_tokenizer

# -- DeepSeek-V3.2 and GLM-5 ------------------------------------------------------------------
# awkward sizes: hidden 36 (partial 8-vectors), indexer head dim 12 with 4 rotated dims,
# 5 experts in one group... top-k 3; a dense first layer
DSA_COMMON = dict(vocab_size=67, hidden_size=36, intermediate_size=24,
                  moe_intermediate_size=12, num_attention_heads=4, num_key_value_heads=4,
                  n_routed_experts=6, n_shared_experts=1, num_experts_per_tok=3, n_group=2,
                  topk_group=1, first_k_dense_replace=1, q_lora_rank=10, kv_lora_rank=8,
                  qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, index_n_heads=16,
                  index_head_dim=12, max_position_embeddings=128, bos_token_id=1,
                  eos_token_id=2, tie_word_embeddings=False)
DSA_FAMILIES = {
    # every layer runs its indexer; the indexer's RoPE is half-split (rotate-half)
    "deepseek_v32": dict(num_hidden_layers=3),
    # interleaved indexer RoPE; layers 1 and 2 reuse layer 0's selection, layer 3 its own
    "glm_moe_dsa": dict(num_hidden_layers=4, index_topk_pattern="FSSF", routed_scaling_factor=1.5),
}


def dsa_config(arch: str, topk: int):
    from transformers import DeepseekV32Config, GlmMoeDsaConfig

    cls = {"deepseek_v32": DeepseekV32Config, "glm_moe_dsa": GlmMoeDsaConfig}[arch]
    return cls(**DSA_COMMON, **DSA_FAMILIES[arch], index_topk=topk)


def make_dsa_checkpoint(arch: str, out: Path, topk: int, seed: int = 0,
                        flat_index: bool = False) -> Path:
    """Random weights (seed 0, whatever topk: the two regimes share them) with random norms;
    flat_index: the indexer's head weights zero, so every index score ties at 0."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(dsa_config(arch, topk))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
        for name, p in model.named_parameters():
            if flat_index and "indexer.weights_proj" in name:
                p.zero_()
    model.save_pretrained(out, max_shard_size="24KB")
    write_tokenizer(out, int(model.config.vocab_size))
    return out


# -- GLM-5.3-Flash (glm5_next) ----------------------------------------------------------------
GLM5_TEXT = dict(vocab_size=67, hidden_size=36, intermediate_size=24, moe_intermediate_size=12,
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
GLM5_VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16,
                   out_hidden_size=36, projection_intermediate_size=16)


def glm5_next_config(**text):
    from transformers import Glm5NextConfig

    return Glm5NextConfig(text_config={**GLM5_TEXT, **text}, vision_config=GLM5_VISION)


GLM5_LIMIT = 0.03  # the engine models' swiglu_limit: most dense/shared gate and up values clamp
GLM5_KPOOL = 3
# the hybrid's index_topk: sparse keeps 4 pools of 3 (from position 14 on a query attends to 12
# selected positions plus its tail); dense: 32 pools cover every context these tests feed
GLM5_TOPK = {"sparse": 12, "dense": 96}
GLM5_MODELS = {
    # all four layers KDA: hyper-connections, clamped SwiGLU (GLM5_LIMIT, so it bites), the
    # bounded decay gate
    "kda_only": dict(layer_types=["linear_attention"] * 4, index_topk_pattern=None,
                     indexer_types=["full"] * 4),
    **{f"hybrid_{regime}": dict(
        num_hidden_layers=5, mlp_layer_types=["dense"] + ["sparse"] * 4,
        layer_types=["linear_attention", "indexed_attention", "indexed_attention",
                     "linear_attention", "indexed_attention"],
        index_topk_pattern="FFSFF", index_n_heads=16, index_kpool=GLM5_KPOOL, index_topk=topk)
       for regime, topk in GLM5_TOPK.items()},
}
# both hybrid regimes: one set of weights
GLM5_SEEDS = {"kda_only": 1, "hybrid_sparse": 2, "hybrid_dense": 2}


def make_glm5_next_checkpoint(src: Path, seed: int, flat_index: bool = False, **text) -> Path:
    """A checkpoint of `glm5_next_config(swiglu_limit=GLM5_LIMIT, **text)` written to `src`
    (random norm weights, a random k-pool gate and position embedding); flat_index: the
    indexer's head weights zero, so every pool scores 0."""
    from transformers import Glm5NextForConditionalGeneration

    torch.manual_seed(seed)
    model = Glm5NextForConditionalGeneration(glm5_next_config(swiglu_limit=GLM5_LIMIT, **text))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
            elif "index_kpool_compress" in name:  # transformers' init: ape 0, gate all ones
                p.copy_(torch.randn_like(p) * 0.5)
            elif flat_index and "indexer.weights_proj" in name:
                p.zero_()
    model.save_pretrained(src)
    write_tokenizer(src, 67)
    return src


def make_hybrid_checkpoint(src: Path) -> Path:
    """The sparse hybrid (tests/tiny_containers.py's glm5_next)."""
    return make_glm5_next_checkpoint(src, GLM5_SEEDS["hybrid_sparse"],
                                     **GLM5_MODELS["hybrid_sparse"])
