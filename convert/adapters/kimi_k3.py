"""Kimi K3 (`KimiK3ForConditionalGeneration`, docs/K3.md): Kimi-Linear's hybrid of KDA and MLA
layers under `text_config`, its tensors under `language_model.`, plus what K3 adds (names and
keys as llama.cpp's K3 converter reads them): a full-rank KDA output gate and bounded decay gate,
an MLA output gate, SiTU-GLU in every FFN, a latent MoE (routed experts work in a narrower space
between `routed_expert_down_proj` and `routed_expert_up_proj`, with an RMSNorm on their sum),
and block attention residuals (score pairs `*_res_norm` / `*_res_proj`). Routed experts usually
MXFP4 (compressed-tensors "mxfp4-pack-quantized", convert/mxfp4.py). Text model only."""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.kimi_k25 import KimiK25Adapter, _renamed
from moepack.convert.adapters.kimi_linear import KimiLinearAdapter
from moepack.convert.errors import SourceError

# (description name, checkpoint suffix under model.layers.{i}) of the AttnRes score pairs
_RES = (("attn_res", "self_attention_res"), ("ffn_res", "mlp_res"))


class KimiK3Adapter(KimiLinearAdapter):
    arch = "kimi_k3"
    hf_architecture = "KimiK3ForConditionalGeneration"
    text_key = "text_config"
    dense_ffn_module = "mlp"  # the published checkpoint's name, as llama.cpp's converter reads
    skipped_parts = ("vision tower and multimodal projector (vision_tower.*, mm_projector.*): "
                     "text-only conversion, images and video are not supported",)
    skipped_prefixes = KimiK25Adapter.skipped_prefixes

    @cached_property
    def model(self) -> dict:
        act = self.cfg("hidden_act", default="situ")
        if act != "situ":
            raise SourceError(f"config.json: text_config.hidden_act {repr(act)[:40]} is not "
                              "Kimi K3's (situ)")
        if self.cfg("mla_use_nope", default=True) is not True:
            raise SourceError("config.json: text_config.mla_use_nope must be true (K3's MLA "
                              "has no RoPE)")
        text = self.text
        self.text = {**text, "hidden_act": "silu"}  # Kimi-Linear's check; SiTU is set below
        try:
            m = dict(super().model)
        finally:
            self.text = text
        beta = self.cfg_float("activation_situ_beta", field="activation.beta")
        linear_beta = self.cfg_float("activation_situ_linear_beta", default=0.0,
                                     field="activation.linear_beta")
        bound = self.linear_attn_config().get("gate_lower_bound")
        self.origin["linear_attention.gate_lower_bound"] = "linear_attn_config.gate_lower_bound"
        m.update({
            "activation": {"kind": "situ", "beta": beta, "linear_beta": linear_beta},
            "attn_res": {"block_size": self.cfg_int("attn_res_block_size",
                                                    field="attn_res.block_size")},
            # llama.cpp's K3 graph norms the q/kv latents with rms_norm_eps (Kimi-Linear's
            # transformers code: 1e-6)
            "attention": {**m["attention"], "output_gate": True,
                          "latent_norm_eps": m["rms_norm_eps"]},
            "linear_attention": {**m["linear_attention"], "output_gate": "full_rank",
                                 "gate_lower_bound": bound},
            "moe": {**m["moe"], "latent_size": self.cfg_int("routed_expert_hidden_size",
                                                            field="moe.latent_size")},
        })
        return m

    def linear_attn_config(self) -> dict:
        sub = self.text.get("linear_attn_config") or {}
        if not isinstance(sub, dict):
            raise SourceError("config.json: text_config.linear_attn_config must be an object")
        return sub

    # -- names: the text model under `language_model.` -------------------------------------
    def trunk(self) -> list[TrunkTensor]:
        out = []
        for t in super().trunk():
            if t.name == "final_norm":
                out += self._res_pair("final_res", "model.output_attn_res")
            out.append(t)
            if t.name.endswith(".ffn_norm"):  # the layer's two AttnRes score pairs
                layer = int(t.name.split(".")[1])
                for name, suffix in _RES:
                    out += self._res_pair(f"layers.{layer}.{name}",
                                          f"model.layers.{layer}.{suffix}")
        return [replace(t, sources=tuple(dict.fromkeys(n for s in t.sources
                                                       for n in _renamed(s))))
                for t in out]

    def _res_pair(self, name: str, src: str) -> list[TrunkTensor]:
        """The score vector of one AttnRes mix, stored as two [hidden] factors."""
        return [TrunkTensor(f"{name}_{x}", "norm", (self.hidden,), (f"{src}_{x}.weight",))
                for x in ("norm", "proj")]

    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        return tuple(n for p in super().moe_prefixes(layer) for n in _renamed(p))

    # -- K3's parts -------------------------------------------------------------------------
    def expert_shape(self, part: str) -> tuple[int, int]:
        """Routed experts work at the latent width."""
        inter, latent = (int(self.model["moe"][k]) for k in ("moe_intermediate_size",
                                                             "latent_size"))
        return (latent, inter) if part == "down" else (inter, latent)

    def attention(self, layer: int) -> list[TrunkTensor]:
        m, h = self.model, self.hidden
        p, out = f"model.layers.{layer}.self_attn", super().attention(layer)
        if m["layer_attention"][layer] == "full":  # the output gate, per head's value
            width = int(m["num_attention_heads"]) * int(m["attention"]["v_head_dim"])
            return [*out, self.linear(f"layers.{layer}.attn.gate", (width, h),
                                      f"{p}.g_proj.weight")]
        la = m["linear_attention"]
        qd = la["num_heads"] * la["head_dim"]
        kept = [t for t in out if not t.name.endswith((".g_a", ".g_b", ".A_log"))]
        c = f"layers.{layer}.linear"
        return [*kept, TrunkTensor(f"{c}.A_log", "bias", (la["num_heads"],), (f"{p}.A_log",)),
                self.linear(f"{c}.g", (qd, h), f"{p}.g_proj.weight")]

    def moe_extra(self, layer: int) -> list[TrunkTensor]:
        latent, h = int(self.model["moe"]["latent_size"]), self.hidden
        pre = self.moe_prefixes(layer)

        def t(name: str, cls: str, shape: tuple[int, ...], suffix: str) -> TrunkTensor:
            return TrunkTensor(f"layers.{layer}.{name}", cls, shape,
                               tuple(f"{q}.{suffix}" for q in pre))

        return [*super().moe_extra(layer),
                t("latent_down", "dense_ffn", (latent, h), "routed_expert_down_proj.weight"),
                t("latent_norm", "norm", (latent,), "routed_expert_norm.weight"),
                t("latent_up", "dense_ffn", (h, latent), "routed_expert_up_proj.weight")]
