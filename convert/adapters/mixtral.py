"""Mixtral (`MixtralForCausalLM`): GQA attention, every layer MoE, softmax top-k routing."""

from __future__ import annotations

from functools import cached_property

from moepack.convert.adapters.base import Adapter, TrunkTensor


class MixtralAdapter(Adapter):
    arch = "mixtral"
    hf_architecture = "MixtralForCausalLM"
    expert_names = {"gate": "w1", "up": "w3", "down": "w2"}

    @cached_property
    def model(self) -> dict:
        m = self.common_model()
        n = m["num_layers"]
        m.update(self.gqa_heads(m["hidden_size"]))
        m.update({
            "qk_norm": False,
            "attention": {"kind": "gqa", **self.sliding_window()},
            "layer_kinds": ["moe"] * n,
            "dense_intermediate_size": None,
            "moe": self.softmax_moe(
                self.cfg_int("num_local_experts", "num_experts", field="moe.num_experts"),
                self.cfg_int("intermediate_size", field="moe.moe_intermediate_size"),
                norm_topk_prob=True),
        })
        return m

    def sliding_window(self) -> dict:
        """`attention.sliding_window` when config.json sets one (checked by the shared rules)."""
        window = self.cfg("sliding_window", default=None)
        if window is None:
            return {}
        self.origin["attention.sliding_window"] = "sliding_window"
        return {"sliding_window": window}

    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        # Hub checkpoints say block_sparse_moe; transformers >= 5 in memory says mlp.
        return (f"model.layers.{layer}.block_sparse_moe", f"model.layers.{layer}.mlp")

    def attention(self, layer: int) -> list[TrunkTensor]:
        return self.gqa(layer, qk_norm=False)
