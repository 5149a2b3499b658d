"""GLM-4.5 / 4.6 / 4.7 (`Glm4MoeForCausalLM`): grouped-query attention with optional q/k/v biases
(`attention_bias`) and per-head q/k RMSNorm (`use_qk_norm`), rotate-half RoPE over the first
`partial_rotary_factor` of each head's dims; the DeepSeek-V3 router (sigmoid, correction bias,
groups, routed scaling), shared experts and `first_k_dense_replace` dense layers. The
multi-token-prediction layers (index >= num_hidden_layers) are carried as MTP sections
(FORMAT.md §4.6), laid out as DeepSeek-V3's."""

from __future__ import annotations

from functools import cached_property

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.deepseek_v3 import DeepseekV3Adapter


class Glm4MoeAdapter(DeepseekV3Adapter):
    arch = "glm4_moe"
    hf_architecture = "Glm4MoeForCausalLM"
    dense_first_default = 1

    @cached_property
    def model(self) -> dict:
        m = self.common_model()
        m.update(self.gqa_heads(m["hidden_size"]))
        kinds = self._kinds(m["num_layers"])
        params = self.text.get("rope_parameters") or {}
        # transformers 5 keeps it in rope_parameters, the Hub configs at the top level
        factor = params.get("partial_rotary_factor",
                            self.cfg_float("partial_rotary_factor", default=0.5))
        m.update({
            "qk_norm": bool(self.cfg("use_qk_norm", default=False)),
            "attention": {"kind": "gqa",
                          "rotary_dim": self.partial_rope(m["head_dim"], factor),
                          "qkv_bias": bool(self.cfg("attention_bias", default=False))},
            "layer_kinds": kinds,
            "dense_intermediate_size": (
                self.cfg_int("intermediate_size", field="dense_intermediate_size")
                if "dense" in kinds else None),
            "moe": self.grouped_sigmoid_moe(),
        })
        self.origin["attention.rotary_dim"] = "partial_rotary_factor"
        return m

    def attention(self, layer: int) -> list[TrunkTensor]:
        return self.gqa(layer, qk_norm=self.model["qk_norm"])
