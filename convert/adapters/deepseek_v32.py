"""DeepSeek-V3.2 (`DeepseekV32ForCausalLM`): DeepSeek-V3's decoder (MLA with a q LoRA, sigmoid
group routing, shared experts, dense first layers) plus DeepSeek Sparse Attention: per layer a
lightning indexer (`self_attn.indexer.*`: its own query projection from the q LoRA latent, one
shared key with a LayerNorm, per-head weights) picks the `index_topk` past positions each query
attends to. The indexer rotates its keys half-split (rotate-half), the MLA part interleaved.
GLM-5 (glm_moe_dsa.py) is the same with an interleaved indexer and shared selections."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.deepseek_v3 import DeepseekV3Adapter
from moepack.convert.errors import SourceError


class DeepseekV32Adapter(DeepseekV3Adapter):
    arch = "deepseek_v32"
    hf_architecture = "DeepseekV32ForCausalLM"
    dense_first_default = 3  # transformers' DeepseekV32Config default
    indexer_rope_interleave: ClassVar[bool] = False

    def _kinds(self, n: int) -> list[str]:
        types = self.text.get("mlp_layer_types")
        if types is None:
            return super()._kinds(n)
        layers = self.cfg_int("num_hidden_layers", field="num_layers")
        if not isinstance(types, list) or len(types) != layers \
                or any(t not in ("dense", "sparse") for t in types):
            raise SourceError(f"config.json: 'mlp_layer_types' must list {layers} entries, "
                              "each 'dense' or 'sparse'")
        # multi-token-prediction layers, past the list, follow first_k_dense_replace as in
        # DeepSeek-V3 (transformers writes the list for the decoder's layers only)
        return ["moe" if t == "sparse" else "dense" for t in types] + super()._kinds(n)[layers:]

    def indexer_types(self, n: int) -> list[str]:
        """Per layer: `full` runs the indexer; DeepSeek-V3.2 runs it on every layer."""
        return ["full"] * n

    @cached_property
    def model(self) -> dict:
        m = DeepseekV3Adapter.model.func(self)  # type: ignore[attr-defined]
        a = m["attention"]
        if not a["q_lora_rank"]:
            raise SourceError(f"config.json: q_lora_rank is required by {self.arch} (the "
                              "indexer's queries come from the q LoRA latent)")
        if self.cfg("attention_bias", default=False):
            raise SourceError(f"config.json: attention_bias true is not supported for {self.arch}")
        a["rope_interleave"] = True  # transformers always interleaves the MLA rope part here
        # q_a/kv_a RMSNorms keep their class default, whatever rms_norm_eps says (GLM-5: 1e-5)
        a["latent_norm_eps"] = 1e-6
        a["dsa"] = {
            "index_n_heads": self.cfg_int("index_n_heads", default=64,
                                          field="attention.dsa.index_n_heads"),
            "index_head_dim": self.cfg_int("index_head_dim", default=128,
                                           field="attention.dsa.index_head_dim"),
            "index_topk": self.cfg_int("index_topk", default=2048,
                                       field="attention.dsa.index_topk"),
            "rope_interleave": self.indexer_rope_interleave,
            "indexer_types": self.indexer_types(m["num_layers"]),
        }
        return m

    def attention(self, layer: int) -> list[TrunkTensor]:
        out = super().attention(layer)
        a, h = self.model["attention"], self.hidden
        dsa = a["dsa"]
        # a multi-token-prediction layer (index >= num_layers) runs its own indexer: GLM-5's
        # published checkpoints hold `model.layers.78.self_attn.indexer.*` (docs/LEARNED.md)
        if layer < len(dsa["indexer_types"]) and dsa["indexer_types"][layer] != "full":
            return out
        heads, dim = dsa["index_n_heads"], dsa["index_head_dim"]
        p, c = f"model.layers.{layer}.self_attn.indexer", f"layers.{layer}.attn"
        return out + [
            self.linear(f"{c}.idx_q", (heads * dim, a["q_lora_rank"]), f"{p}.wq_b.weight"),
            self.linear(f"{c}.idx_k", (dim, h), f"{p}.wk.weight"),
            self.linear(f"{c}.idx_k_norm", (dim,), f"{p}.k_norm.weight", "norm"),
            self.linear(f"{c}.idx_k_norm_bias", (dim,), f"{p}.k_norm.bias", "bias"),
            # transformers keeps weights_proj in f32 (_keep_in_fp32_modules): the router class
            self.linear(f"{c}.idx_weights", (heads, h), f"{p}.weights_proj.weight", "router"),
        ]
