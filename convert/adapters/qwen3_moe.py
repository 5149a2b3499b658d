"""Qwen3-MoE (`Qwen3MoeForCausalLM`): GQA with per-head q/k RMSNorm; dense layers chosen by
`mlp_only_layers` and `decoder_sparse_step`."""

from __future__ import annotations

from functools import cached_property

from moepack.convert.adapters.base import Adapter, TrunkTensor


class Qwen3MoeAdapter(Adapter):
    arch = "qwen3_moe"
    hf_architecture = "Qwen3MoeForCausalLM"

    def _kinds(self, n: int, experts: int) -> list[str]:
        # Same rule as transformers' Qwen3MoeDecoderLayer.
        only = set(self.cfg("mlp_only_layers", default=[]))
        step = int(self.cfg("decoder_sparse_step", default=1))
        return ["moe" if (i not in only and experts > 0 and (i + 1) % step == 0) else "dense"
                for i in range(n)]

    @cached_property
    def model(self) -> dict:
        m = self.common_model()
        heads = int(self.cfg("num_attention_heads"))
        experts = int(self.cfg("num_experts", "num_local_experts"))
        kinds = self._kinds(m["num_layers"], experts)
        m.update({
            "num_attention_heads": heads,
            "num_key_value_heads": int(self.cfg("num_key_value_heads", default=heads)),
            "head_dim": int(self.cfg("head_dim", default=m["hidden_size"] // heads)),
            "qk_norm": True,
            "attention": {"kind": "gqa"},
            "layer_kinds": kinds,
            "dense_intermediate_size": (int(self.cfg("intermediate_size"))
                                        if "dense" in kinds else None),
            "moe": {
                "num_experts": experts,
                "top_k": int(self.cfg("num_experts_per_tok")),
                "moe_intermediate_size": int(self.cfg("moe_intermediate_size")),
                "scoring": "softmax",
                "norm_topk_prob": bool(self.cfg("norm_topk_prob", default=False)),
                "n_group": 1,
                "topk_group": 1,
                "routed_scaling_factor": 1.0,
                "num_shared_experts": 0,
                "shared_intermediate_size": None,
            },
        })
        return m

    def attention(self, layer: int) -> list[TrunkTensor]:
        return self.gqa(layer, qk_norm=True)
