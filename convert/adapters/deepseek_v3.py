"""DeepSeek-V3 / Kimi-K2 (`DeepseekV3ForCausalLM`): MLA attention, `first_k_dense_replace`
dense layers, shared experts, sigmoid routing with `e_score_correction_bias` and group-limited
top-k. Multi-token-prediction layers (index >= num_hidden_layers) are carried as MTP sections
(FORMAT.md §4.6) unless the converter is told to drop them."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

from moepack.convert.adapters.base import Adapter, TrunkTensor
from moepack.convert.errors import SourceError
from moepack.format.model_desc import INT_BOUNDS


class DeepseekV3Adapter(Adapter):
    arch = "deepseek_v3"
    hf_architecture = "DeepseekV3ForCausalLM"

    dense_first_default: ClassVar[int] = 0  # transformers' first_k_dense_replace default

    def _kinds(self, n: int) -> list[str]:
        first = self.cfg_int("first_k_dense_replace", default=self.dense_first_default)
        freq = self.cfg_int("moe_layer_freq", default=1)
        return ["moe" if (i >= first and i % freq == 0) else "dense" for i in range(n)]

    @cached_property
    def model(self) -> dict:
        m = self.common_model()
        heads = self.cfg_int("num_attention_heads", field="num_attention_heads")
        nope = self.cfg_int("qk_nope_head_dim", field="attention.qk_nope_head_dim")
        rope = self.cfg_int("qk_rope_head_dim", field="attention.qk_rope_head_dim")
        self.origin.update(num_key_value_heads="num_attention_heads",
                           head_dim="qk_nope_head_dim + qk_rope_head_dim")
        q_lora = self.cfg_int("q_lora_rank", default=0, hi=INT_BOUNDS["attention.q_lora_rank"][1])
        self.origin["attention.q_lora_rank"] = "q_lora_rank"
        kinds = self._kinds(m["num_layers"])
        m.update({
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "head_dim": nope + rope,
            "qk_norm": False,
            "attention": {"kind": "mla", "q_lora_rank": q_lora or None,
                          "kv_lora_rank": self.cfg_int("kv_lora_rank",
                                                       field="attention.kv_lora_rank"),
                          "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
                          "v_head_dim": self.cfg_int("v_head_dim", field="attention.v_head_dim"),
                          "rope_interleave": bool(self.cfg("rope_interleave", default=True))},
            "layer_kinds": kinds,
            "dense_intermediate_size": (
                self.cfg_int("intermediate_size", field="dense_intermediate_size")
                if "dense" in kinds else None),
            "moe": self.grouped_sigmoid_moe(),
        })
        return m

    def grouped_sigmoid_moe(self) -> dict:
        """`moe` of DeepSeek-V3-style routing (GLM-4.5 uses the same router): sigmoid scores
        with a correction bias, group-limited top-k, routed scaling, shared experts."""
        inter = self.cfg_int("moe_intermediate_size", field="moe.moe_intermediate_size")
        shared = self.cfg_int("n_shared_experts", default=0, field="moe.num_shared_experts")
        self.origin["moe.shared_intermediate_size"] = "moe_intermediate_size x n_shared_experts"
        return {
            "num_experts": self.cfg_int("n_routed_experts", "num_local_experts",
                                        field="moe.num_experts"),
            "top_k": self.cfg_int("num_experts_per_tok", field="moe.top_k"),
            "moe_intermediate_size": inter,
            "scoring": self._scoring(),
            "norm_topk_prob": bool(self.cfg("norm_topk_prob", default=True)),
            "n_group": self.cfg_int("n_group", default=1, field="moe.n_group"),
            "topk_group": self.cfg_int("topk_group", default=1, field="moe.topk_group"),
            "routed_scaling_factor": self.cfg_float("routed_scaling_factor", default=1.0,
                                                    field="moe.routed_scaling_factor"),
            "num_shared_experts": shared,
            "shared_intermediate_size": inter * shared if shared else None,
        }

    def _scoring(self) -> str:
        scoring = self.cfg("scoring_func", default="sigmoid")
        self.origin["moe.scoring"] = "scoring_func"
        if scoring not in ("sigmoid", "softmax"):
            raise SourceError(f"config.json: scoring_func {repr(scoring)[:80]} is not supported "
                              "(sigmoid or softmax)")
        return scoring

    def attention(self, layer: int) -> list[TrunkTensor]:
        a, h = self.model["attention"], self.hidden
        heads = int(self.model["num_attention_heads"])
        qk = a["qk_nope_head_dim"] + a["qk_rope_head_dim"]
        p, c = f"model.layers.{layer}.self_attn", f"layers.{layer}.attn"
        out = []
        if a["q_lora_rank"]:
            r = a["q_lora_rank"]
            out += [self.linear(f"{c}.q_a", (r, h), f"{p}.q_a_proj.weight"),
                    self.linear(f"{c}.q_a_norm", (r,), f"{p}.q_a_layernorm.weight", "norm"),
                    self.linear(f"{c}.q_b", (heads * qk, r), f"{p}.q_b_proj.weight")]
        else:
            out.append(self.linear(f"{c}.q", (heads * qk, h), f"{p}.q_proj.weight"))
        kv = a["kv_lora_rank"]
        out += [self.linear(f"{c}.kv_a", (kv + a["qk_rope_head_dim"], h),
                            f"{p}.kv_a_proj_with_mqa.weight"),
                self.linear(f"{c}.kv_a_norm", (kv,), f"{p}.kv_a_layernorm.weight", "norm"),
                self.linear(f"{c}.kv_b", (heads * (a["qk_nope_head_dim"] + a["v_head_dim"]), kv),
                            f"{p}.kv_b_proj.weight"),
                self.linear(f"{c}.o", (h, heads * a["v_head_dim"]), f"{p}.o_proj.weight")]
        return out

    def moe_extra(self, layer: int) -> list[TrunkTensor]:
        moe, p = self.model["moe"], f"model.layers.{layer}.mlp"
        out = []
        if moe["scoring"] == "sigmoid":
            out.append(TrunkTensor(f"layers.{layer}.router_bias", "bias", (moe["num_experts"],),
                                   (f"{p}.gate.e_score_correction_bias",)))
        if moe["num_shared_experts"]:
            out += self.mlp(f"layers.{layer}.shared", "shared_expert", f"{p}.shared_experts",
                            moe["shared_intermediate_size"])
        return out

    # -- multi-token prediction: `model.layers.{num_hidden_layers + i}` (FORMAT.md §4.6) ------
    mtp_note = "not in the checkpoint"

    def mtp_is_moe(self, layer: int) -> bool:
        return self._kinds(layer + 1)[layer] == "moe"

    def mtp_tensors(self, layer: int) -> list[TrunkTensor]:
        """Embedding, the two input norms and their projection, the decoder layer, the head."""
        h, vocab = self.hidden, int(self.model["vocab_size"])
        p, c = f"model.layers.{layer}", f"layers.{layer}"
        out = [TrunkTensor(f"{c}.mtp.embed", "embed", (vocab, h), (f"{p}.embed_tokens.weight",)),
               self.linear(f"{c}.mtp.enorm", (h,), f"{p}.enorm.weight", "norm"),
               self.linear(f"{c}.mtp.hnorm", (h,), f"{p}.hnorm.weight", "norm"),
               self.linear(f"{c}.mtp.eh_proj", (h, 2 * h), f"{p}.eh_proj.weight"),
               self.linear(f"{c}.attn_norm", (h,), f"{p}.input_layernorm.weight", "norm"),
               self.linear(f"{c}.ffn_norm", (h,), f"{p}.post_attention_layernorm.weight", "norm")]
        out += self.attention(layer)
        if self.mtp_is_moe(layer):
            out.append(TrunkTensor(f"{c}.router", "router",
                                   (int(self.model["moe"]["num_experts"]), h),
                                   tuple(f"{q}.gate.weight" for q in self.moe_prefixes(layer))))
            out += self.moe_extra(layer)
        else:
            out += self.mlp(f"{c}.ffn", "dense_ffn", f"{p}.mlp",
                            int(self.model["dense_intermediate_size"] or 0))
        return out + [
            self.linear(f"{c}.mtp.head_norm", (h,), f"{p}.shared_head.norm.weight", "norm"),
            TrunkTensor(f"{c}.mtp.head", "lm_head", (vocab, h), (f"{p}.shared_head.head.weight",)),
        ]
