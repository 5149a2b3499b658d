"""A GLM-4.5-architecture (`glm4_moe`) twin of the trained demo model, so that the quality matrix's
method (bench/quality.py) runs on partial-RoPE attention with q/k/v biases and sigmoid routing
(issue 16) without training a second model.

    python -m bench.glm_twin OUT_DIR [--demo demo/model]

The demo's trained weights go into a Glm4MoeForCausalLM of the same sizes: embedding (tied LM
head), q/k/v/o, norms, the 8 routed experts and the router. What GLM has and the demo lacks is
filled in small and seeded: q/k/v biases and a shared expert (normal, std 0.02; the down
projection 0.002), a zero routing correction bias. RoPE turns only the first half of each head's
dims (partial_rotary_factor 0.5, GLM-4.5's setting), which the demo was not trained with, and the
router takes the top 2 of sigmoid scores (the same experts as the demo's softmax) renormalised.
So it is not a trained GLM: its held-out perplexity is worse than the demo's (printed), but its
distributions are those of trained weights, far from the flat ones of a random model, which is
what the KL statistics need.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def glm_config(demo: dict):
    from transformers import Glm4MoeConfig

    same = {k: demo[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "head_dim",
                                 "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "num_experts_per_tok")}
    return Glm4MoeConfig(
        **same, moe_intermediate_size=demo["intermediate_size"],
        n_routed_experts=demo["num_local_experts"],
        n_shared_experts=1, first_k_dense_replace=0, n_group=1, topk_group=1,
        routed_scaling_factor=1.0, norm_topk_prob=True, attention_bias=True, use_qk_norm=False,
        partial_rotary_factor=0.5, rms_norm_eps=demo["rms_norm_eps"],
        max_position_embeddings=demo["max_position_embeddings"], tie_word_embeddings=True,
        bos_token_id=demo["bos_token_id"], eos_token_id=demo["eos_token_id"],
        pad_token_id=demo["pad_token_id"])


def build(demo_dir: Path, out: Path) -> Path:
    from transformers import Glm4MoeForCausalLM

    demo_cfg = json.loads((demo_dir / "config.json").read_text())
    torch.manual_seed(0)
    model = Glm4MoeForCausalLM(glm_config(demo_cfg)).to(torch.float32).eval()
    with safe_open(str(demo_dir / "model.safetensors"), "pt") as f:
        src = {k: f.get_tensor(k).to(torch.float32) for k in f.keys()}  # noqa: SIM118
    E = demo_cfg["num_local_experts"]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(src["model.embed_tokens.weight"])
        model.model.norm.weight.copy_(src["model.norm.weight"])
        for i, layer in enumerate(model.model.layers):
            p = f"model.layers.{i}."
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, n).weight.copy_(src[p + f"self_attn.{n}.weight"])
            for n in ("q_proj", "k_proj", "v_proj"):
                getattr(layer.self_attn, n).bias.normal_(0.0, 0.02)
            layer.input_layernorm.weight.copy_(src[p + "input_layernorm.weight"])
            layer.post_attention_layernorm.weight.copy_(src[p + "post_attention_layernorm.weight"])
            moe, ex = layer.mlp, f"{p}block_sparse_moe.experts."
            moe.gate.weight.copy_(src[p + "block_sparse_moe.gate.weight"])
            moe.gate.e_score_correction_bias.zero_()
            # fused layout: gate_up_proj [E, 2I, H] = [w1; w3], down_proj [E, H, I] = w2
            gate_up = [torch.cat([src[f"{ex}{e}.w1.weight"], src[f"{ex}{e}.w3.weight"]])
                       for e in range(E)]
            moe.experts.gate_up_proj.copy_(torch.stack(gate_up))
            moe.experts.down_proj.copy_(torch.stack([src[f"{ex}{e}.w2.weight"] for e in range(E)]))
            sh = moe.shared_experts
            sh.gate_proj.weight.normal_(0.0, 0.02)
            sh.up_proj.weight.normal_(0.0, 0.02)
            sh.down_proj.weight.normal_(0.0, 0.002)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (demo_dir / name).exists():
            shutil.copy(demo_dir / name, out / name)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--demo", type=Path, default=ROOT / "demo" / "model")
    args = ap.parse_args(argv)
    build(args.demo, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
