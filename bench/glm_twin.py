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
from pathlib import Path

import torch

from bench.twin import demo_tensors, fill_moe, fill_norms_and_embedding, save_twin

ROOT = Path(__file__).resolve().parent.parent


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
    src = demo_tensors(demo_dir)
    with torch.no_grad():
        fill_norms_and_embedding(model, src)
        for i, layer in enumerate(model.model.layers):
            p = f"model.layers.{i}."
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, n).weight.copy_(src[p + f"self_attn.{n}.weight"])
            for n in ("q_proj", "k_proj", "v_proj"):
                getattr(layer.self_attn, n).bias.normal_(0.0, 0.02)
            fill_moe(layer.mlp, src, i, demo_cfg["num_local_experts"])
    return save_twin(model, demo_dir, out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--demo", type=Path, default=ROOT / "demo" / "model")
    args = ap.parse_args(argv)
    build(args.demo, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
