"""Qwen3-MoE (`Qwen3MoeForCausalLM`): GQA with per-head q/k RMSNorm; dense layers chosen by
`mlp_only_layers` and `decoder_sparse_step`."""

from __future__ import annotations

from functools import cached_property

from moepack.convert.adapters.base import Adapter, TrunkTensor
from moepack.convert.errors import SourceError


class Qwen3MoeAdapter(Adapter):
    arch = "qwen3_moe"
    hf_architecture = "Qwen3MoeForCausalLM"

    def _kinds(self, n: int, experts: int) -> list[str]:
        # Same rule as transformers' Qwen3MoeDecoderLayer.
        only = self.cfg("mlp_only_layers", default=[])
        if not (isinstance(only, list) and all(isinstance(i, int) for i in only)):
            raise SourceError(f"config.json: mlp_only_layers must be a list of layer indices, "
                              f"got {repr(only)[:80]}")
        dense = set(only)
        step = self.cfg_int("decoder_sparse_step", default=1)
        return ["moe" if (i not in dense and experts > 0 and (i + 1) % step == 0) else "dense"
                for i in range(n)]

    @cached_property
    def model(self) -> dict:
        if self.cfg("use_sliding_window", default=False) is True:
            # attention.sliding_window could describe it, but no test compares it with transformers
            raise SourceError("config.json: 'use_sliding_window' is true: sliding-window "
                              "attention of qwen3_moe is not supported")
        m = self.common_model()
        experts = self.cfg_int("num_experts", "num_local_experts", field="moe.num_experts")
        kinds = self._kinds(m["num_layers"], experts)
        m.update(self.gqa_heads(m["hidden_size"]))
        m.update({
            "qk_norm": True,
            "attention": {"kind": "gqa"},
            "layer_kinds": kinds,
            "dense_intermediate_size": (
                self.cfg_int("intermediate_size", field="dense_intermediate_size")
                if "dense" in kinds else None),
            "moe": self.softmax_moe(
                experts, self.cfg_int("moe_intermediate_size", field="moe.moe_intermediate_size"),
                norm_topk_prob=bool(self.cfg("norm_topk_prob", default=False))),
        })
        return m

    def attention(self, layer: int) -> list[TrunkTensor]:
        return self.gqa(layer, qk_norm=True)
