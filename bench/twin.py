"""Shared pieces of the demo twins (bench/glm_twin.py, bench/dsa_twin.py): the trained demo's
weights moved into another family's model class of the same sizes, so that the quality matrix's
method (bench/quality.py) runs on that family's code paths with trained, not flat, distributions."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import safe_open

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def demo_tensors(demo_dir: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(demo_dir / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k).to(torch.float32) for k in f.keys()}  # noqa: SIM118


def fill_moe(moe, src: dict[str, torch.Tensor], layer: int, num_experts: int) -> None:
    """A DeepSeek-style MoE block (`gate`, fused `experts`, `shared_experts`) from the demo's
    Mixtral block: the same router and experts, a zero routing correction bias and a small
    seeded shared expert (normal, std 0.02; the down projection 0.002), which the demo lacks."""
    p = f"model.layers.{layer}.block_sparse_moe."
    moe.gate.weight.copy_(src[p + "gate.weight"])
    moe.gate.e_score_correction_bias.zero_()
    ex = p + "experts."
    # fused layout: gate_up_proj [E, 2I, H] = [w1; w3], down_proj [E, H, I] = w2
    gate_up = [torch.cat([src[f"{ex}{e}.w1.weight"], src[f"{ex}{e}.w3.weight"]])
               for e in range(num_experts)]
    moe.experts.gate_up_proj.copy_(torch.stack(gate_up))
    moe.experts.down_proj.copy_(torch.stack([src[f"{ex}{e}.w2.weight"]
                                             for e in range(num_experts)]))
    sh = moe.shared_experts
    sh.gate_proj.weight.normal_(0.0, 0.02)
    sh.up_proj.weight.normal_(0.0, 0.02)
    sh.down_proj.weight.normal_(0.0, 0.002)


def fill_norms_and_embedding(model, src: dict[str, torch.Tensor]) -> None:
    """Embedding (and an untied LM head from it), the final norm and each layer's two norms."""
    model.model.embed_tokens.weight.copy_(src["model.embed_tokens.weight"])
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight.copy_(src["model.embed_tokens.weight"])
    model.model.norm.weight.copy_(src["model.norm.weight"])
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        layer.input_layernorm.weight.copy_(src[p + "input_layernorm.weight"])
        layer.post_attention_layernorm.weight.copy_(src[p + "post_attention_layernorm.weight"])


def save_twin(model, demo_dir: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (demo_dir / name).exists():
            shutil.copy(demo_dir / name, out / name)
    return out
