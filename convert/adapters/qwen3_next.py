"""Qwen3-Next (`Qwen3NextForCausalLM`): a hybrid of Gated DeltaNet linear-attention layers
(`layer_types` "linear_attention", by default 3 of every 4) and full-attention layers (GQA with
per-head q/k norm, an output sigmoid gate carried in q_proj, partial RoPE 0.25); every RMSNorm
but the DeltaNet's gated one scales by `(1 + w)`; MoE layers route as Qwen3-MoE (softmax top-k)
and add one shared expert scaled by sigmoid(shared_expert_gate · x)."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.qwen3_moe import Qwen3MoeAdapter
from moepack.convert.errors import SourceError

_LAYER_TYPES = {"linear_attention": "linear", "full_attention": "full"}


class Qwen3NextAdapter(Qwen3MoeAdapter):
    arch = "qwen3_next"
    hf_architecture = "Qwen3NextForCausalLM"
    # FORMAT.md §7 linear_attention.projection: how the DeltaNet input projections are stored
    projection: ClassVar[str] = "grouped_qkvz"

    def _layer_attention(self, n: int) -> list[str]:
        types = self.cfg("layer_types", default=None)
        if types is None:  # transformers' rule when the config lists no layer_types
            interval = self.cfg_int("full_attention_interval", default=4)
            if interval < 1:
                raise SourceError("config.json: full_attention_interval must be >= 1")
            return ["full" if (i + 1) % interval == 0 else "linear" for i in range(n)]
        if not (isinstance(types, list) and len(types) == n
                and all(t in _LAYER_TYPES for t in types)):
            raise SourceError(f"config.json: layer_types must list num_hidden_layers ({n}) of "
                              f"linear_attention / full_attention, got {repr(types)[:80]}")
        return [_LAYER_TYPES[t] for t in types]

    @cached_property
    def model(self) -> dict:
        m = self.common_model()
        act = self.cfg("hidden_act", default="silu")
        if act != "silu":
            raise SourceError(f"config.json: hidden_act {repr(act)[:40]} is not supported (silu)")
        if self.cfg("attention_bias", default=False):
            raise SourceError(f"config.json: attention_bias is not supported for {self.arch}")
        experts = self.cfg_int("num_experts", field="moe.num_experts")
        kinds = self._kinds(m["num_layers"], experts)
        m.update(self.gqa_heads(m["hidden_size"]))
        params = self.text.get("rope_parameters") or {}
        factor = params.get("partial_rotary_factor",
                            self.cfg_float("partial_rotary_factor", default=0.25))
        self.origin["attention.rotary_dim"] = "partial_rotary_factor"
        moe = self.softmax_moe(
            experts, self.cfg_int("moe_intermediate_size", field="moe.moe_intermediate_size"),
            norm_topk_prob=bool(self.cfg("norm_topk_prob", default=True)))
        shared = self.cfg_int("shared_expert_intermediate_size", default=0,
                              field="moe.shared_intermediate_size")
        if shared:
            moe.update(num_shared_experts=1, shared_intermediate_size=shared,
                       shared_expert_gate=True)
        m.update({
            "qk_norm": True,
            "rms_norm_unit_offset": True,
            "attention": {"kind": "gqa", "rotary_dim": self.partial_rope(m["head_dim"], factor),
                          "output_gate": True},
            "layer_attention": self._layer_attention(m["num_layers"]),
            "linear_attention": {
                "kind": "gated_deltanet",
                "projection": self.projection,
                "num_key_heads": self.cfg_int("linear_num_key_heads",
                                              field="linear_attention.num_key_heads"),
                "num_value_heads": self.cfg_int("linear_num_value_heads",
                                                field="linear_attention.num_value_heads"),
                "key_head_dim": self.cfg_int("linear_key_head_dim",
                                             field="linear_attention.key_head_dim"),
                "value_head_dim": self.cfg_int("linear_value_head_dim",
                                               field="linear_attention.value_head_dim"),
                "conv_kernel_size": self.cfg_int("linear_conv_kernel_dim", default=4,
                                                 field="linear_attention.conv_kernel_size"),
            },
            "layer_kinds": kinds,
            "dense_intermediate_size": (
                self.cfg_int("intermediate_size", field="dense_intermediate_size")
                if "dense" in kinds else None),
            "moe": moe,
        })
        return m

    def attention(self, layer: int) -> list[TrunkTensor]:
        m, h = self.model, self.hidden
        if m["layer_attention"][layer] == "full":
            out = self.gqa(layer, qk_norm=True)
            q = out[0]  # q_proj holds each head's query and its output gate
            return [TrunkTensor(q.name, q.cls, (2 * q.shape[0], h), q.sources), *out[1:]]
        la = m["linear_attention"]
        nk, nv = la["num_key_heads"], la["num_value_heads"]
        kd, vd = nk * la["key_head_dim"], nv * la["value_head_dim"]
        conv = 2 * kd + vd
        p, c = f"model.layers.{layer}.linear_attn", f"layers.{layer}.linear"
        if la["projection"] == "grouped_qkvz":
            proj = [self.linear(f"{c}.qkvz", (conv + vd, h), f"{p}.in_proj_qkvz.weight"),
                    self.linear(f"{c}.ba", (2 * nv, h), f"{p}.in_proj_ba.weight")]
        else:
            proj = [self.linear(f"{c}.{x}", (n, h), f"{p}.in_proj_{x}.weight")
                    for x, n in (("qkv", conv), ("z", vd), ("b", nv), ("a", nv))]
        return proj + [
            self.linear(f"{c}.conv", (conv, 1, la["conv_kernel_size"]), f"{p}.conv1d.weight",
                        "bias"),
            self.linear(f"{c}.dt_bias", (nv,), f"{p}.dt_bias", "bias"),
            self.linear(f"{c}.A_log", (nv,), f"{p}.A_log", "bias"),
            self.linear(f"{c}.norm", (la["value_head_dim"],), f"{p}.norm.weight", "norm"),
            self.linear(f"{c}.out", (h, vd), f"{p}.out_proj.weight"),
        ]

    def moe_extra(self, layer: int) -> list[TrunkTensor]:
        moe, p = self.model["moe"], self.moe_prefixes(layer)[0]
        if not moe["num_shared_experts"]:
            return []
        return [*self.mlp(f"layers.{layer}.shared", "shared_expert", f"{p}.shared_expert",
                          moe["shared_intermediate_size"]),
                TrunkTensor(f"layers.{layer}.shared_gate", "router", (1, self.hidden),
                            (f"{p}.shared_expert_gate.weight",))]
