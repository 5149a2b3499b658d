"""Kimi-Linear (`KimiLinearForCausalLM`): a hybrid of KDA linear-attention layers (Kimi Delta
Attention: short convs on q/k/v, per-channel decay gate, sigmoid-gated output norm) and MLA
layers that use no positional encoding at all (the rope part of q and k is left unrotated);
DeepSeek-V3-style MoE (sigmoid scores + correction bias, shared experts) after
`first_k_dense_replace` dense layers.  The Hub checkpoint keeps the MoE under
`block_sparse_moe` with experts `w1`/`w2`/`w3` and one conv per q/k/v; transformers' in-memory
names (`mlp.experts.gate_up_proj`, ...) are accepted too."""

from __future__ import annotations

from collections.abc import Collection
from functools import cached_property
from typing import ClassVar

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.deepseek_v3 import DeepseekV3Adapter
from moepack.convert.errors import SourceError
from moepack.convert.source import SourceRef
from moepack.format.model_desc import INT_BOUNDS

_CONVS = ("q_conv", "k_conv", "v_conv")  # canonical names, in the channel order of [q k v]
_LAYER_TYPES = {"linear_attention": "linear", "full_attention": "full"}
# transformers' attribute_map: the checkpoint's key -> the name DeepSeek-style code reads
_ALIASES = {"model_max_length": "max_position_embeddings", "num_experts": "n_routed_experts",
            "num_experts_per_token": "num_experts_per_tok",
            "num_shared_experts": "n_shared_experts", "moe_renormalize": "norm_topk_prob",
            "num_expert_group": "n_group"}
# the MLA's q_a / kv_a RMSNorms are built without an eps argument (transformers' default)
_LATENT_NORM_EPS = 1e-6


class KimiLinearAdapter(DeepseekV3Adapter):
    arch = "kimi_linear"
    hf_architecture = "KimiLinearForCausalLM"
    expert_names: ClassVar[dict[str, str]] = {"gate": "w1", "up": "w3", "down": "w2"}
    dense_first_default: ClassVar[int] = 1

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.text = {**self.text, **{dst: self.text[src] for src, dst in _ALIASES.items()
                                     if self.text.get(src) is not None
                                     and self.text.get(dst) is None}}

    def _linear_cfg(self, key: str, flat: str, default: int, field: str) -> int:
        """A KDA setting from `linear_attn_config` (the checkpoint's) or the flat key."""
        sub = self.text.get("linear_attn_config")
        if sub is not None and not isinstance(sub, dict):
            raise SourceError("config.json: linear_attn_config must be an object")
        if sub and sub.get(key) is not None:
            v = sub[key]
            lo, hi = INT_BOUNDS[field]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise SourceError(f"config.json: 'linear_attn_config.{key}' must be an integer "
                                  f"in {lo}..{hi}, got {repr(v)[:40]}")
            self.origin[field] = f"linear_attn_config.{key}"
            return v
        return self.cfg_int(flat, default=default, field=field)

    def _layer_attention(self, n: int) -> list[str]:
        types = self.cfg("layer_types", default=None)
        if types is not None:
            if not (isinstance(types, list) and len(types) == n
                    and all(t in _LAYER_TYPES for t in types)):
                raise SourceError(f"config.json: layer_types must list num_hidden_layers ({n}) "
                                  f"of linear_attention / full_attention, got {repr(types)[:80]}")
            return [_LAYER_TYPES[t] for t in types]
        sub = self.text.get("linear_attn_config") or {}
        full, kda = sub.get("full_attn_layers"), sub.get("kda_layers")
        if full is None or kda is None:  # transformers' default: every 4th layer full
            return ["full" if i and i % 4 == 0 else "linear" for i in range(n)]
        listed = [*full, *kda] if isinstance(full, list) and isinstance(kda, list) else None
        if listed is None or sorted(x if isinstance(x, int) else -1 for x in listed) \
                != list(range(1, n + 1)):
            raise SourceError("config.json: linear_attn_config.full_attn_layers and kda_layers "
                              f"must list the layers 1..{n} once each")
        return ["full" if i + 1 in full else "linear" for i in range(n)]

    def _kinds(self, n: int) -> list[str]:
        types = self.cfg("mlp_layer_types", default=None)
        if types is None:
            return super()._kinds(n)
        if not (isinstance(types, list) and len(types) == n
                and all(t in ("dense", "sparse") for t in types)):
            raise SourceError(f"config.json: mlp_layer_types must list num_hidden_layers ({n}) "
                              f"of dense / sparse, got {repr(types)[:80]}")
        return ["moe" if t == "sparse" else "dense" for t in types]

    def _scoring(self) -> str:
        act = self.cfg("moe_router_activation_func", default="sigmoid")
        if act != "sigmoid":
            raise SourceError(f"config.json: moe_router_activation_func {repr(act)[:40]} is "
                              "not supported (sigmoid)")
        return "sigmoid"

    @cached_property
    def model(self) -> dict:
        act = self.cfg("hidden_act", default="silu")
        if act != "silu":
            raise SourceError(f"config.json: hidden_act {repr(act)[:40]} is not supported (silu)")
        if self.cfg("attention_bias", default=False):
            raise SourceError(f"config.json: attention_bias is not supported for {self.arch}")
        m = dict(super().model)
        n = m["num_layers"]
        m["attention"] = {**m["attention"], "rope": False, "rope_interleave": False,
                          "latent_norm_eps": _LATENT_NORM_EPS}
        m.update({
            "rope_scaling": None,  # nothing is rotated
            "layer_attention": self._layer_attention(n),
            "linear_attention": {
                "kind": "kda",
                "num_heads": self._linear_cfg("num_heads", "linear_num_heads", 32,
                                              "linear_attention.num_heads"),
                "head_dim": self._linear_cfg("head_dim", "linear_head_dim", 128,
                                             "linear_attention.head_dim"),
                "conv_kernel_size": self._linear_cfg("short_conv_kernel_size",
                                                     "linear_conv_kernel_dim", 4,
                                                     "linear_attention.conv_kernel_size"),
            },
        })
        return m

    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        return (f"model.layers.{layer}.block_sparse_moe", f"model.layers.{layer}.mlp")

    # the module a dense layer's FFN is written under (save_pretrained's; `mlp` is read too)
    dense_ffn_module = "block_sparse_moe"

    def mlp(self, name: str, cls: str, prefix: str, inter: int) -> list[TrunkTensor]:
        """Dense and shared FFNs under either module name; the native (first) name is the one
        the checkpoint writes (`dense_ffn_module` for dense layers)."""
        dense = prefix.endswith(".mlp")
        alt = (prefix.replace(".mlp", ".block_sparse_moe") if dense
               else prefix.replace(".block_sparse_moe.", ".mlp."))
        alt_first = dense and self.dense_ffn_module == "block_sparse_moe"
        out = []
        for t in super().mlp(name, cls, prefix, inter):
            other = t.sources[0].replace(prefix, alt)
            out.append(TrunkTensor(t.name, t.cls, t.shape,
                                   (other, *t.sources) if alt_first else (*t.sources, other)))
        return out

    def moe_extra(self, layer: int) -> list[TrunkTensor]:
        moe, pre = self.model["moe"], self.moe_prefixes(layer)
        out = [TrunkTensor(f"layers.{layer}.router_bias", "bias", (moe["num_experts"],),
                           tuple(f"{p}.gate.e_score_correction_bias" for p in pre))]
        if moe["num_shared_experts"]:
            out += self.mlp(f"layers.{layer}.shared", "shared_expert",
                            f"{pre[0]}.shared_experts", moe["shared_intermediate_size"])
        return out

    def resolve(self, t: TrunkTensor, names: Collection[str]) -> SourceRef:
        """The q/k/v convs also as row ranges of transformers' stacked `conv1d.weight`."""
        parts = t.name.split(".")
        if (len(parts) == 4 and parts[2] == "linear" and parts[3] in _CONVS
                and t.sources[0] not in names):
            stacked = f"model.layers.{parts[1]}.self_attn.conv1d.weight"
            if stacked in names:
                i, rows = _CONVS.index(parts[3]), t.shape[0]
                return SourceRef(stacked, rows=(i * rows, (i + 1) * rows))
        return super().resolve(t, names)

    def attention(self, layer: int) -> list[TrunkTensor]:
        if self.model["layer_attention"][layer] == "full":
            return super().attention(layer)
        la, h = self.model["linear_attention"], self.hidden
        nh, dk, k = la["num_heads"], la["head_dim"], la["conv_kernel_size"]
        qd = nh * dk
        p, c = f"model.layers.{layer}.self_attn", f"layers.{layer}.linear"

        def t(name: str, shape: tuple[int, ...], src: str, cls: str = "attn",
              alt: str | None = None) -> TrunkTensor:
            return TrunkTensor(f"{c}.{name}", cls, shape,
                               (f"{p}.{src}", f"{p}.{alt}") if alt else (f"{p}.{src}",))

        fg = "forget_gate"  # transformers' in-memory module of the decay gate
        return [
            *(t(x, (qd, h), f"{x}_proj.weight") for x in ("q", "k", "v")),
            *(t(f"{x}_conv", (qd, 1, k), f"{x}_conv1d.weight", "bias") for x in ("q", "k", "v")),
            t("f_a", (dk, h), "f_a_proj.weight", alt=f"{fg}.f_a_proj.weight"),
            t("f_b", (qd, dk), "f_b_proj.weight", alt=f"{fg}.f_b_proj.weight"),
            t("dt_bias", (qd,), "dt_bias", "bias", alt=f"{fg}.dt_bias"),
            t("A_log", (1, 1, nh, 1), "A_log", "bias", alt=f"{fg}.A_log"),
            t("b", (nh, h), "b_proj.weight"),
            t("g_a", (dk, h), "g_a_proj.weight"),
            t("g_b", (qd, dk), "g_b_proj.weight"),
            t("norm", (dk,), "o_norm.weight", "norm"),
            t("out", (h, qd), "o_proj.weight"),
        ]
