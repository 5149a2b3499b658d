"""MiniMax-M2 (`MiniMaxM2ForCausalLM`): grouped-query attention with one RMSNorm over all heads'
queries (and one over all keys) before RoPE, rotate-half RoPE over the first `rotary_dim` dims of
each head; every layer MoE with sigmoid routing plus a correction bias, no groups, the chosen
weights always renormalised. Expert names as Mixtral (`block_sparse_moe.experts.N.w1/w2/w3`)."""

from __future__ import annotations

from functools import cached_property

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.mixtral import MixtralAdapter
from moepack.convert.errors import SourceError


class MiniMaxM2Adapter(MixtralAdapter):
    arch = "minimax_m2"
    hf_architecture = "MiniMaxM2ForCausalLM"
    mtp_note = "MiniMax-M2's published checkpoints hold no weights for them"

    def mtp_declared(self) -> int:
        """The Hub configs declare MTP modules (`use_mtp`, `num_mtp_modules`; transformers'
        MiniMaxM2Config has neither) that no published checkpoint holds: `info` says so."""
        return self.cfg_int("num_mtp_modules", default=0) if self.cfg("use_mtp", default=False) \
            is True else 0

    @cached_property
    def model(self) -> dict:
        m = self.common_model()
        m.update(self.gqa_heads(m["hidden_size"]))
        hd = m["head_dim"]
        for key, want in (("scoring_func", "sigmoid"), ("qk_norm_type", "per_layer")):
            got = self.cfg(key, default=want)
            if got != want:  # transformers' MiniMaxM2 implements only these
                raise SourceError(f"config.json: {key} {repr(got)[:80]} is not supported "
                                  f"(minimax_m2: {want})")
        params = self.text.get("rope_parameters") or {}
        if "partial_rotary_factor" in params:
            factor = params["partial_rotary_factor"]
        elif self.cfg("rotary_dim", default=None) is not None:  # the Hub configs' spelling
            factor = self.cfg_int("rotary_dim") / hd if hd else 0.0
        else:
            factor = self.cfg_float("partial_rotary_factor", default=1.0)
        self.origin["attention.rotary_dim"] = "rotary_dim"
        m.update({
            "qk_norm": True,
            "attention": {"kind": "gqa", "rotary_dim": self.partial_rope(hd, factor),
                          "qk_norm_scope": "all_heads"},
            "layer_kinds": ["moe"] * m["num_layers"],
            "dense_intermediate_size": None,
            "moe": {
                "num_experts": self.cfg_int("num_local_experts", "num_experts",
                                            field="moe.num_experts"),
                "top_k": self.cfg_int("num_experts_per_tok", field="moe.top_k"),
                "moe_intermediate_size": self.cfg_int("intermediate_size",
                                                      field="moe.moe_intermediate_size"),
                "scoring": "sigmoid",
                "norm_topk_prob": True,
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

    def moe_extra(self, layer: int) -> list[TrunkTensor]:
        n = int(self.model["moe"]["num_experts"])
        srcs = tuple(f"{q}.e_score_correction_bias" for q in self.moe_prefixes(layer))
        return [TrunkTensor(f"layers.{layer}.router_bias", "bias", (n,), srcs)]
