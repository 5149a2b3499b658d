"""GLM-5.3-Flash (`Glm5NextForConditionalGeneration`, transformers' `glm5_next`): a hybrid of
Kimi-Linear's KDA layers (kimi_linear.py) with K3's bounded decay gate and GLM-5's MLA layers
with DeepSeek Sparse Attention (glm_moe_dsa.py), under `text_config`, tensors under
`model.language_model.`. What it adds (spec/FORMAT.md §7.2): no RoPE anywhere
(`qk_rope_head_dim` 0), a k-pool indexer (scores gated averages of `index_kpool` keys, picks
whole pools, always adds the incomplete tail), 4-stream manifold-constrained hyper-connections
around every attention and FFN block, and SwiGLU with clamped gate/up in every FFN. The vision
tower is skipped (text-only conversion)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import replace
from functools import cached_property
from typing import ClassVar

from moepack.convert.adapters.base import Adapter, TrunkTensor
from moepack.convert.adapters.glm_moe_dsa import GlmMoeDsaAdapter
from moepack.convert.adapters.kimi_linear import KimiLinearAdapter
from moepack.convert.errors import SourceError
from moepack.convert.source import SourceRef
from moepack.format.model_desc import MAX_HC_MULT, MAX_SINKHORN_ITERS

# transformers maps the older `full_attention` spelling to `indexed_attention`
_LAYER_TYPES = {"linear_attention": "linear", "indexed_attention": "full",
                "full_attention": "full"}
_TEXT = "model.language_model."
# hyper-connection parts: (name in the checkpoint and the description, in-memory name, class)
_HC_PARTS = (("fn", "fn", "router"), ("base", "base", "bias"), ("scale", "scale", "bias"))


def _text_name(name: str) -> str:
    """The text model's tensors live under `model.language_model.`; lm_head stays on top."""
    return _TEXT + name[len("model."):] if name.startswith("model.layers.") \
        or name in ("model.embed_tokens.weight", "model.norm.weight") else name


class Glm5NextAdapter(KimiLinearAdapter, GlmMoeDsaAdapter):
    arch = "glm5_next"
    hf_architecture = "Glm5NextForConditionalGeneration"
    text_key = "text_config"
    expert_names: ClassVar[dict[str, str]] = Adapter.expert_names
    skipped_parts = ("vision tower (model.visual.*): text-only conversion, images and video "
                     "are not supported",)
    skipped_prefixes = ("model.visual.",)

    mtp_note = "GLM-5.3-Flash's MTP layer is not supported"
    mtp_tensors = Adapter.mtp_tensors
    mtp_is_moe = Adapter.mtp_is_moe

    def _kinds(self, n: int) -> list[str]:
        if self.text.get("mlp_layer_types") is None:  # transformers: the first 3 dense
            return ["dense"] * min(3, n) + ["moe"] * (n - min(3, n))
        return super()._kinds(n)

    def _layer_attention(self, n: int) -> list[str]:
        types = self.text.get("layer_types")
        if types is None:  # transformers' default: every 4th layer (3, 7, ...) DSA
            return ["full" if i % 4 == 3 else "linear" for i in range(n)]
        if not (isinstance(types, list) and len(types) == n
                and all(t in _LAYER_TYPES for t in types)):
            raise SourceError(f"config.json: text_config.layer_types must list "
                              f"num_hidden_layers ({n}) of linear_attention / "
                              f"indexed_attention, got {repr(types)[:80]}")
        return [_LAYER_TYPES[t] for t in types]

    def _no_rope_text(self) -> dict:
        """transformers refuses a rope part on GLM-5.3-Flash's MLA; the shared MLA code sizes a
        rope part of at least 2, so it is read as 2 and set to 0 afterwards."""
        rope = self.cfg_int("qk_rope_head_dim", default=0)
        if rope:
            raise SourceError(f"config.json: text_config.qk_rope_head_dim must be 0 "
                              f"({self.arch} uses no positional encoding), got {rope}")
        return {**self.text, "qk_rope_head_dim": 2}

    @cached_property
    def model(self) -> dict:
        text = self.text
        self.text = self._no_rope_text()
        try:
            m = dict(super().model)
        finally:
            self.text = text
        n = m["num_layers"]
        nope = m["attention"]["qk_nope_head_dim"]
        m["head_dim"] = nope
        self.origin["head_dim"] = "qk_nope_head_dim"
        dsa = m["attention"]["dsa"]
        kpool = self.cfg_int("index_kpool", default=16, field="attention.dsa.kpool")
        m["attention"] = {
            **m["attention"], "qk_rope_head_dim": 0, "rope": False, "rope_interleave": False,
            "latent_norm_eps": m["rms_norm_eps"],  # GLM's q_a/kv_a norms use rms_norm_eps
            "dsa": {**dsa, "rope_interleave": False,
                    "indexer_types": self._dsa_types(dsa["indexer_types"],
                                                     m["layer_attention"]),
                    "kpool": kpool,
                    "kpool_select_tail": bool(self.cfg("index_kpool_always_select_tail",
                                                       default=True))}}
        if dsa["index_topk"] % kpool:
            raise SourceError(f"config.json: text_config.index_topk ({dsa['index_topk']}) must "
                              f"be a multiple of index_kpool ({kpool})")
        m["linear_attention"] = {**m["linear_attention"],
                                 "gate_lower_bound": self._lower_bound()}
        m["swiglu_limit"] = self.cfg_float("swiglu_limit", default=10.0, field="swiglu_limit")
        m["hyper_connections"] = {
            "mult": self.cfg_int("hc_mult", default=4, field="hyper_connections.mult",
                                 hi=MAX_HC_MULT),
            "eps": self.cfg_float("hc_eps", default=1e-6, field="hyper_connections.eps"),
            "sinkhorn_iters": self.cfg_int("hc_sinkhorn_iters", default=20,
                                           field="hyper_connections.sinkhorn_iters",
                                           hi=MAX_SINKHORN_ITERS)}
        if len(m["layer_kinds"]) != n:
            raise SourceError("config.json: text_config.mlp_layer_types must list "
                              f"num_hidden_layers ({n}) entries")
        return m

    def _lower_bound(self) -> float | None:
        """KDA's decay: `linear_lower_bound` < 0 bounds it (K3's gate); null: softplus form."""
        v = self.text.get("linear_lower_bound", -5.0)
        sub = self.text.get("linear_attn_config")
        if isinstance(sub, dict) and sub.get("gate_lower_bound") is not None:
            v = sub["gate_lower_bound"]
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v < 0:
            raise SourceError(f"config.json: text_config.linear_lower_bound must be a number "
                              f"< 0 or null, got {repr(v)[:40]}")
        self.origin["linear_attention.gate_lower_bound"] = "text_config.linear_lower_bound"
        return float(v)

    def _dsa_types(self, types: list[str], attn: list[str]) -> list[str]:
        """transformers hands a full DSA layer's selection only to the layer right after it, so
        a `shared` DSA layer must follow a `full` DSA layer; linear layers run no indexer (their
        entry is written `full`: nothing is shared from or to them)."""
        out = []
        for i, (t, kind) in enumerate(zip(types, attn, strict=True)):
            if kind == "linear":
                out.append("full")
                continue
            if t == "shared" and (i == 0 or attn[i - 1] != "full" or types[i - 1] != "full"):
                raise SourceError(f"config.json: text_config.indexer_types[{i}] is shared but "
                                  f"layer {i - 1} is not a full DSA layer (transformers only "
                                  "passes a selection to the next layer)")
            out.append(t)
        return out

    # -- names -------------------------------------------------------------------------------
    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        return (f"{_TEXT}layers.{layer}.mlp",)

    def mlp(self, name: str, cls: str, prefix: str, inter: int) -> list[TrunkTensor]:
        return Adapter.mlp(self, name, cls, prefix, inter)

    def trunk(self) -> list[TrunkTensor]:
        out = []
        for t in super().trunk():
            out.append(TrunkTensor(t.name, t.cls, t.shape,
                                   tuple(_text_name(s) for s in t.sources)))
            if t.name.endswith(".ffn_norm"):
                out += self._hyper(int(t.name.split(".")[1]))
        return out

    def _hyper(self, layer: int) -> list[TrunkTensor]:
        """A layer's two hyper-connections (before its attention and its FFN); saved as
        `hc_attn_fn`, in memory as `attn_hc.fn`."""
        hc, h = int(self.model["hyper_connections"]["mult"]), self.hidden
        shapes = {"fn": ((2 + hc) * hc, hc * h), "base": ((2 + hc) * hc,), "scale": (3,)}
        p = f"{_TEXT}layers.{layer}"
        return [TrunkTensor(f"layers.{layer}.{block}_hc.{part}", cls, shapes[part],
                            (f"{p}.hc_{block}_{part}", f"{p}.{block}_hc.{alt}"))
                for block in ("attn", "ffn") for part, alt, cls in _HC_PARTS]

    def attention(self, layer: int) -> list[TrunkTensor]:
        out = super().attention(layer)
        m = self.model
        if m["layer_attention"][layer] == "linear":
            nh = m["linear_attention"]["num_heads"]
            # A_log is one value per head here ([num_heads], as K3's)
            return [TrunkTensor(t.name, t.cls, (nh,), t.sources)
                    if t.name.endswith(".A_log") else t for t in out]
        dsa = m["attention"]["dsa"]
        if dsa["indexer_types"][layer] != "full":
            return out
        p, c = f"model.layers.{layer}.self_attn.indexer", f"layers.{layer}.attn"
        dim = dsa["index_head_dim"]
        return out + [
            self.linear(f"{c}.idx_pool_ape", (dsa["kpool"], dim),
                        f"{p}.index_kpool_compress_ape", "bias"),
            self.linear(f"{c}.idx_pool_gate", (dim, self.hidden),
                        f"{p}.index_kpool_compress_gate"),
        ]

    def resolve(self, t: TrunkTensor, names: Collection[str]) -> SourceRef:
        """Kimi-Linear's lookup (the q/k/v convs also as rows of transformers' in-memory stacked
        `self_attn.conv1d.weight`), which spells names without `language_model.`."""
        ref = super().resolve(t, _TextNames(names))
        return replace(ref, name=_text_name(ref.name))


class _TextNames(Collection[str]):
    """`names` as Kimi-Linear's lookup asks for them: `model.layers.…` also finds
    `model.language_model.layers.…`."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = names

    def __contains__(self, name: object) -> bool:
        return name in self.names or (isinstance(name, str) and _text_name(name) in self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
