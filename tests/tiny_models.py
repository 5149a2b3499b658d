"""Tiny random-weight Hugging Face MoE checkpoints for tests (convert, verify, runtime).

    make_checkpoint("mixtral", tmp_path / "src")                  # Hub layout, several shards
    make_checkpoint("qwen3_moe", d, layout="fused")                # transformers-5 fused experts
    make_checkpoint("deepseek_v3", d, fp8_block=(8, 8))            # fp8 e4m3 + weight_scale_inv
    make_checkpoint("kimi_k25", d, int4_group=8)                   # INT4 pack-quantized experts

Sizes are deliberately awkward (hidden not a multiple of 8, odd expert counts, top-k 1 and 8) and
tiny, so a checkpoint takes well under a second to build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

ARCHS = ("mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "minimax_m2", "kimi_k25",
         "qwen3_next", "qwen3_5_moe", "kimi_linear")

_TINY: dict[str, dict[str, Any]] = {
    "mixtral": dict(vocab_size=67, hidden_size=20, intermediate_size=12, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, num_local_experts=3,
                    num_experts_per_tok=1, max_position_embeddings=64),
    "qwen3_moe": dict(vocab_size=67, hidden_size=36, intermediate_size=28,
                      moe_intermediate_size=12, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=6, num_experts=9, num_experts_per_tok=8,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                      max_position_embeddings=64),
    "deepseek_v3": dict(vocab_size=67, hidden_size=28, intermediate_size=24,
                        moe_intermediate_size=12, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
                        q_lora_rank=10, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2,
                        v_head_dim=4, max_position_embeddings=64),
    # q/k/v biases, per-head qk-norm, partial RoPE (6 of 12 dims), grouped sigmoid routing
    "glm4_moe": dict(vocab_size=67, hidden_size=36, intermediate_size=20,
                     moe_intermediate_size=12, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=12, n_routed_experts=8, n_shared_experts=1,
                     num_experts_per_tok=3, n_group=2, topk_group=1, first_k_dense_replace=1,
                     routed_scaling_factor=1.5, attention_bias=True, use_qk_norm=True,
                     max_position_embeddings=64),
    # full-width q/k norm, partial RoPE (rotary_dim 4 of head_dim 10), sigmoid routing + bias
    "minimax_m2": dict(vocab_size=67, hidden_size=44, intermediate_size=12, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=10, rotary_dim=4,
                       num_local_experts=5, num_experts_per_tok=2, max_position_embeddings=64),
    # Gated DeltaNet layers 0-2 (2 key heads, 4 value heads: grouped), full attention layer 3
    # with output gate and RoPE on 2 of 8 head dims; dense layer 1; a gated shared expert
    "qwen3_next": dict(vocab_size=67, hidden_size=36, intermediate_size=20,
                       moe_intermediate_size=12, shared_expert_intermediate_size=10,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=8, linear_value_head_dim=6, num_experts=5,
                       num_experts_per_tok=2, mlp_only_layers=[1], max_position_embeddings=64),
    # Kimi-Linear: KDA layers 0, 2, 3 (3 heads of 6 dims), MLA without RoPE at layer 1 (no q
    # LoRA, 3 heads, rope part 4); dense layer 0, then sigmoid routing over 7 experts + 1 shared
    "kimi_linear": dict(vocab_size=67, hidden_size=36, intermediate_size=20,
                        moe_intermediate_size=12, num_hidden_layers=4, num_attention_heads=3,
                        num_key_value_heads=3, kv_lora_rank=8, q_lora_rank=None,
                        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, num_experts=7,
                        num_experts_per_tok=2, routed_scaling_factor=1.5,
                        linear_attn_config={"head_dim": 6, "num_heads": 3,
                                            "short_conv_kernel_size": 4,
                                            "full_attn_layers": [2], "kda_layers": [1, 3, 4]},
                        pad_token_id=0, max_position_embeddings=64),
}
# Kimi K2.5: the DeepSeek-V3 text model under text_config (hidden 28: partial 8-vectors), with a
# one-layer vision tower that the converter must skip.
_KIMI_TEXT = dict(_TINY["deepseek_v3"], model_type="deepseek_v3", tie_word_embeddings=False,
                  routed_scaling_factor=2.0)
_KIMI_VISION = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=16,
                    num_attention_heads=2, patch_size=2, pos_emb_height=4, pos_emb_width=4)


# Qwen3.5-MoE: the Qwen3-Next decoder (split DeltaNet projections, every layer MoE) under
# text_config, with a one-block vision tower that the converter must skip.
_QWEN35_TEXT = {k: v for k, v in _TINY["qwen3_next"].items() if k != "mlp_only_layers"}
_QWEN35_VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, patch_size=2,
                      out_hidden_size=36, num_position_embeddings=16)


def tiny_config(arch: str, **overrides: Any):
    """The transformers config object for a tiny `arch` model (kimi_k25: overrides go to the
    text model)."""
    from transformers import (
        DeepseekV3Config,
        Glm4MoeConfig,
        Kimi_K25Config,
        KimiLinearConfig,
        MiniMaxM2Config,
        MixtralConfig,
        Qwen3_5MoeConfig,
        Qwen3MoeConfig,
        Qwen3NextConfig,
    )

    if arch == "qwen3_5_moe":
        text = {**_QWEN35_TEXT, "bos_token_id": 1, "eos_token_id": 2, **overrides}
        return Qwen3_5MoeConfig(text_config=text, vision_config=dict(_QWEN35_VISION),
                                tie_word_embeddings=False)
    if arch == "kimi_k25":
        text = {**_KIMI_TEXT, "bos_token_id": 1, "eos_token_id": 2, **overrides}
        return Kimi_K25Config(text_config=text, vision_config=dict(_KIMI_VISION),
                              projection_hidden_size=16, tie_word_embeddings=False)
    cls = {"mixtral": MixtralConfig, "qwen3_moe": Qwen3MoeConfig,
           "deepseek_v3": DeepseekV3Config, "glm4_moe": Glm4MoeConfig,
           "minimax_m2": MiniMaxM2Config, "qwen3_next": Qwen3NextConfig,
           "kimi_linear": KimiLinearConfig}[arch]
    return cls(**{**_TINY[arch], "bos_token_id": 1, "eos_token_id": 2, **overrides})


def model_class(arch: str):
    """The transformers class that loads `arch` checkpoints (Kimi K2.5 is not a CausalLM)."""
    from transformers import (
        AutoModelForCausalLM,
        Kimi_K25ForConditionalGeneration,
        Qwen3_5MoeForConditionalGeneration,
    )

    return {"kimi_k25": Kimi_K25ForConditionalGeneration,
            "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration}.get(arch, AutoModelForCausalLM)


def make_checkpoint(arch: str, out_dir: str | Path, *, seed: int = 0,
                    shard_size: str | int | None = None, layout: str = "hub",
                    fp8_block: tuple[int, int] | None = None, int4_group: int | None = None,
                    tokenizer: bool = True, **overrides: Any) -> Path:
    """Write a random-weight checkpoint of `arch` to `out_dir` and return `out_dir`.

    layout: "hub" (per-expert tensors, what `save_pretrained` writes) or "fused"
    (`mlp.experts.gate_up_proj` / `mlp.experts.down_proj`, transformers 5 in-memory names).
    fp8_block: store 2-D projection weights as fp8 e4m3 with `weight_scale_inv` block scales.
    int4_group: store the routed experts as symmetric INT4 compressed-tensors pack-quantized
    weights with groups of this many columns (Kimi K2.5's format; its group size is 32).
    shard_size: `max_shard_size` for save_pretrained (default: small enough for several shards).
    """
    out = Path(out_dir)
    torch.manual_seed(seed)
    cls = model_class(arch)
    cfg = tiny_config(arch, **overrides)
    model = cls(cfg) if arch in ("kimi_k25", "qwen3_5_moe") else cls.from_config(cfg)
    with torch.no_grad():  # norms start at exactly 1.0; make them random too
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    shard = shard_size or "24KB"
    if layout == "hub" and fp8_block is None and int4_group is None and arch != "kimi_k25":
        model.save_pretrained(out, max_shard_size=shard)
    else:
        model.config.architectures = [type(model).__name__]  # save_pretrained would add it
        model.config.save_pretrained(out)
        model.generation_config.save_pretrained(out)
        tensors = _hub_state(model) if layout == "hub" else dict(model.state_dict())
        if fp8_block is not None:
            tensors = _to_fp8(tensors, fp8_block)
            _set_quant_config(out, fp8_block)
        if int4_group is not None:
            tensors = _to_int4(tensors, int4_group)
            _set_int4_config(out, int4_group)
        _save_sharded(tensors, out, _parse_size(shard))
    if tokenizer:
        write_tokenizer(out, int(model.config.get_text_config().vocab_size))
    return out


def _hub_state(model) -> dict[str, torch.Tensor]:
    """Per-expert Hub names, taken from save_pretrained's own output (ground truth)."""
    import tempfile

    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for f in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(f, framework="pt") as s:
                for k in s.keys():
                    # transformers 5.24 saves Kimi K2.5's text layers as `blocks` (its reverse
                    # of a vision-tower rename); the Hub checkpoints say `layers`
                    out[k.replace("language_model.model.blocks.", "language_model.model.layers.")
                        ] = s.get_tensor(k)
    return out


def _to_int4(tensors: dict[str, torch.Tensor], group: int) -> dict[str, torch.Tensor]:
    """Routed experts as symmetric INT4 pack-quantized (`weight_packed` int32, bf16
    `weight_scale` per group, `weight_shape`), as in Kimi K2 Thinking / K2.5."""
    import numpy as np
    from moepack.convert.packed_int import pack

    out: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if ".experts." not in name or not name.endswith("_proj.weight") or w.dim() != 2:
            out[name] = w
            continue
        rows, cols = w.shape
        g = w.float().reshape(rows, cols // group, group)
        scale = (g.abs().amax(-1) / 7).clamp(min=1e-8).to(torch.bfloat16)
        q = torch.clamp(torch.round(g / scale.float()[..., None]), -8, 7).reshape(rows, cols)
        base = name.removesuffix("weight")
        out[base + "weight_packed"] = torch.from_numpy(pack(q.to(torch.int8).numpy(), 4))
        out[base + "weight_scale"] = scale
        out[base + "weight_shape"] = torch.from_numpy(np.array([rows, cols], dtype=np.int64))
    return out


def _set_int4_config(out: Path, group: int) -> None:
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    # where Kimi K2.5 keeps it: the text model's config
    cfg.get("text_config", cfg)["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                   "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": group, "dynamic": False, "actorder": None,
                        "observer": "minmax", "observer_kwargs": {},
                        "block_structure": None}}}}
    path.write_text(json.dumps(cfg, indent=2))


def _to_fp8(tensors: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """DeepSeek-V3 style: projection weights fp8 e4m3 with f32 `weight_scale_inv` per block;
    embeddings, norms, router and lm_head stay in high precision (as in the real checkpoint)."""
    out: dict[str, torch.Tensor] = {}
    b0, b1 = block
    for name, w in tensors.items():
        keep = (w.dim() != 2 or "embed_tokens" in name or name == "lm_head.weight"
                or name.endswith("mlp.gate.weight") or "layernorm" in name)
        if keep:
            out[name] = w
            continue
        rows, cols = w.shape
        gr, gc = -(-rows // b0), -(-cols // b1)
        pad = torch.zeros(gr * b0, gc * b1)
        pad[:rows, :cols] = w.float()
        amax = pad.reshape(gr, b0, gc, b1).abs().amax(dim=(1, 3)).clamp(min=1e-12)
        scale = amax / 448.0
        full = scale.repeat_interleave(b0, 0).repeat_interleave(b1, 1)[:rows, :cols]
        out[name] = (w.float() / full).to(torch.float8_e4m3fn)
        out[name.removesuffix("weight") + "weight_scale_inv"] = scale.contiguous()
    return out


def _set_quant_config(out: Path, block: tuple[int, int]) -> None:
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                  "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    path.write_text(json.dumps(cfg, indent=2))


def _parse_size(size: str | int) -> int:
    if isinstance(size, int):
        return size
    units = {"KB": 1000, "MB": 1000**2, "GB": 1000**3}
    return int(float(size[:-2]) * units[size[-2:].upper()])


def _save_sharded(tensors: dict[str, torch.Tensor], out: Path, limit: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        n = t.numel() * t.element_size()
        if shards[-1] and used + n > limit:
            shards.append({})
            used = 0
        shards[-1][name] = t
        used += n
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in tensors.values())},
             "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer with exactly `vocab_size` tokens plus a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }, indent=2))
