"""What every architecture adapter provides, and the parts the three decoders share."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from moepack.convert.errors import SourceError
from moepack.convert.source import SourceRef
from moepack.format.model_desc import INT_BOUNDS, SOURCE_INT_BOUNDS

EXPERT_PARTS = ("gate", "up", "down")
_MISSING = object()


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


@dataclass(frozen=True)
class TrunkTensor:
    """A canonical RAM-resident tensor (FORMAT.md §7) and where a checkpoint may hold it.

    `sources[0]` is the architecture's native Hugging Face name (what `export` writes); later
    entries are alternative spellings other savers use."""

    name: str
    cls: str
    shape: tuple[int, ...]
    sources: tuple[str, ...]


class Adapter:
    """Maps one architecture's config.json and tensor names to the canonical layout."""

    arch: ClassVar[str]
    hf_architecture: ClassVar[str]
    hf_aliases: ClassVar[tuple[str, ...]] = ()  # other `architectures` names of the same model
    # Parts of such checkpoints that are not converted, one line each (manifest source.skipped)
    skipped_parts: ClassVar[tuple[str, ...]] = ()
    # Name prefixes of the checkpoint tensors those parts are (not reported again as unused)
    skipped_prefixes: ClassVar[tuple[str, ...]] = ()
    # Checkpoint tensors the description does not use, summarised (set by the planner)
    unused_note: str | None = None
    # Native per-expert projection names: part -> suffix under `<prefix>.experts.N.`.
    expert_names: ClassVar[dict[str, str]] = {"gate": "gate_proj", "up": "up_proj",
                                              "down": "down_proj"}

    # config.json key of the nested text-model config that holds the decoder's settings
    # (multimodal wrappers such as Kimi K2.5); None: the settings are at the top level
    text_key: ClassVar[str | None] = None

    def __init__(self, config: dict) -> None:
        self.config = config
        sub = config.get(self.text_key) if self.text_key else config
        if not isinstance(sub, dict):
            raise SourceError(f"config.json: {self.text_key!r} must be an object")
        self.text = sub  # where the decoder's settings are read
        # description field (FORMAT.md §7 path) -> the config.json key it came from, so that
        # a rule broken by the description names what the user can fix
        self.origin: dict[str, str] = {}

    # -- config access ---------------------------------------------------------------------
    def _lookup(self, keys: tuple[str, ...], default: Any) -> tuple[str, Any]:
        """(key, value) of the first of `keys` present (and not null) in the decoder's config;
        the key as config.json spells its path (`text_config.hidden_size` when nested)."""
        pre = f"{self.text_key}." if self.text_key else ""
        for k in keys:
            if self.text.get(k) is not None:
                return pre + k, self.text[k]
        if default is _MISSING:
            raise SourceError(f"config.json: missing {pre + keys[0]!r} (needed for {self.arch})")
        return pre + keys[0], default

    def cfg(self, *keys: str, default: Any = _MISSING) -> Any:
        """First of `keys` present (and not null) in config.json."""
        return self._lookup(keys, default)[1]

    def cfg_int(self, *keys: str, default: Any = _MISSING, field: str | None = None,
                hi: int | None = None) -> int:
        """An integer setting (JSON floats with integral values accepted), >= 0 and within the
        bounds of `field` (format/model_desc.py), checked before anything is sized by it."""
        key, v = self._lookup(keys, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise SourceError(f"config.json: {key!r} must be a non-negative integer, "
                              f"got {_short(v)}")
        bare = key.rsplit(".", 1)[-1]
        lo, top = INT_BOUNDS.get(field or "") or SOURCE_INT_BOUNDS.get(bare, (0, 1 << 63))
        top = top if hi is None else hi
        if field is not None:
            self.origin[field] = key
        if not lo <= v <= top and v != default:
            raise SourceError(f"config.json: {key!r} must be an integer in {lo}..{top}, got {v}")
        return v

    def cfg_float(self, *keys: str, default: Any = _MISSING, field: str | None = None) -> float:
        key, v = self._lookup(keys, default)  # NaN/Inf pass here: the description's rules
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SourceError(f"config.json: {key!r} must be a number, got {_short(v)}")
        if field is not None:
            self.origin[field] = key
        return float(v)

    def rope(self) -> tuple[float, dict | None]:
        """(rope_theta, rope_scaling) from either the classic keys or transformers 5's
        `rope_parameters`."""
        params = self.text.get("rope_parameters") or {}
        if not isinstance(params, dict):
            raise SourceError(f"config.json: 'rope_parameters' must be an object, got "
                              f"{_short(params)}")
        theta = self.cfg_float("rope_theta", default=params.get("rope_theta", 10000.0),
                               field="rope_theta")
        scaling = self.text.get("rope_scaling")
        pre = f"{self.text_key}." if self.text_key else ""
        self.origin["rope_scaling"] = pre + "rope_scaling"
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = params
            self.origin["rope_scaling"] = pre + "rope_parameters"
        return theta, self.normal_rope_scaling(scaling)

    def normal_rope_scaling(self, src: Any) -> Any:
        """The description's rope_scaling (FORMAT.md §7) from the source's object, with the
        defaults transformers' `_compute_yarn_parameters` applies written out: null for plain
        RoPE, else every YaRN key. What is not an object or not YaRN goes on as it is, for the
        description's rules to refuse, naming it."""
        if not isinstance(src, dict):
            return src
        kind = src.get("rope_type", src.get("type", "default"))
        if kind == "default":
            return None
        if kind != "yarn":
            return {"rope_type": kind}
        where = self.origin["rope_scaling"]
        if not src.get("truncate", True):  # transformers then skips the floor/ceil of the range
            raise SourceError(f"config.json: {where + '.truncate'!r} is false: YaRN without "
                              "the truncated correction range is not supported")
        # transformers: a top-level original_max_position_embeddings wins (Phi-3's layout),
        # then the object's, then max_position_embeddings
        pre = f"{self.text_key}." if self.text_key else ""
        for key, obj, name in (("original_max_position_embeddings", self.text, pre),
                               ("original_max_position_embeddings", src, where + "."),
                               ("max_position_embeddings", self.text, pre)):
            if obj.get(key) is not None:
                orig = obj[key]
                self.origin["rope_scaling.original_max_position_embeddings"] = name + key
                break
        else:
            orig = None
        factor = src.get("factor")
        if factor is None and _number(orig) and _number(self.text.get("max_position_embeddings")):
            factor = self.text["max_position_embeddings"] / orig  # transformers 5, DeepSeek-V3
        return {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": orig,
            # transformers reads these with `or`: 0 or absent is the default
            "beta_fast": src.get("beta_fast") or 32.0,
            "beta_slow": src.get("beta_slow") or 1.0,
            "mscale": src.get("mscale") or 0.0,
            "mscale_all_dim": src.get("mscale_all_dim") or 0.0,
            "attention_factor": src.get("attention_factor"),  # null: derived from the mscales
        }

    def common_model(self) -> dict:
        theta, scaling = self.rope()
        return {
            "arch": self.arch,
            "vocab_size": self.cfg_int("vocab_size", field="vocab_size"),
            "hidden_size": self.cfg_int("hidden_size", field="hidden_size"),
            "num_layers": self.cfg_int("num_hidden_layers", field="num_layers"),
            "rms_norm_eps": self.cfg_float("rms_norm_eps", default=1e-6, field="rms_norm_eps"),
            "rope_theta": theta,
            "rope_scaling": scaling,
            "max_position_embeddings": self.cfg_int("max_position_embeddings",
                                                    field="max_position_embeddings"),
            "tie_word_embeddings": bool(self.cfg("tie_word_embeddings", default=False)),
            "bos_token_id": self.text.get("bos_token_id", self.config.get("bos_token_id")),
            "eos_token_id": self.text.get("eos_token_id", self.config.get("eos_token_id")),
        }

    def softmax_moe(self, experts: int, inter: int, norm_topk_prob: bool) -> dict:
        """`moe` description of softmax top-k routing without shared experts (FORMAT.md §7)."""
        return {
            "num_experts": experts,
            "top_k": self.cfg_int("num_experts_per_tok", field="moe.top_k"),
            "moe_intermediate_size": inter,
            "scoring": "softmax",
            "norm_topk_prob": norm_topk_prob,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
            "num_shared_experts": 0,
            "shared_intermediate_size": None,
        }

    def plain_config(self) -> dict:
        """config.json for dequantised weights (`export`): no quantization_config, at the top
        level or in the text model's config."""
        cfg = {k: v for k, v in self.config.items() if k != "quantization_config"}
        if self.text_key and isinstance(cfg.get(self.text_key), dict):
            cfg[self.text_key] = {k: v for k, v in cfg[self.text_key].items()
                                  if k != "quantization_config"}
        return cfg

    def skipped(self) -> list[str]:
        """What the container leaves out of the checkpoint (FORMAT.md §6 `source.skipped`)."""
        out = list(self.skipped_parts)
        mtp = self.mtp_declared()
        if mtp > self.mtp_layers:
            n = int(self.model["num_layers"])
            out.append(f"multi-token-prediction layers {n + self.mtp_layers}..{n + mtp - 1}: "
                       f"not converted ({self.mtp_note})")
        if self.unused_note:
            out.append(self.unused_note)
        return out

    # -- multi-token prediction (FORMAT.md §4.6) -------------------------------------------
    # How many MTP layers the container carries and, when fewer than declared, why: set by the
    # planner once it knows the checkpoint and the --mtp setting.
    mtp_layers: int = 0
    mtp_note: str = "this architecture's MTP layers are not supported"

    def mtp_declared(self) -> int:
        return self.cfg_int("num_nextn_predict_layers", default=0)

    def mtp_tensors(self, layer: int) -> list[TrunkTensor]:
        """Canonical tensors of MTP decoder layer `layer` (>= num_layers), experts excluded;
        empty where the architecture's MTP layers are not supported."""
        return []

    def mtp_is_moe(self, layer: int) -> bool:
        return False

    def mtp_layer_numbers(self) -> list[int]:
        n = int(self.model["num_layers"])
        return list(range(n, n + self.mtp_layers))

    def all_moe_layers(self) -> list[int]:
        """MoE layers whose experts are converted: the decoder's, then the MTP layers'."""
        return self.moe_layers() + [x for x in self.mtp_layer_numbers() if self.mtp_is_moe(x)]

    # -- per architecture ------------------------------------------------------------------
    @cached_property
    def model(self) -> dict:
        """The normalised model description (FORMAT.md §7)."""
        raise NotImplementedError

    def attention(self, layer: int) -> list[TrunkTensor]:
        raise NotImplementedError

    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        """Module prefixes of layer's MoE block; the first is the native one."""
        return (f"model.layers.{layer}.mlp",)

    def moe_extra(self, layer: int) -> list[TrunkTensor]:
        """Router bias and shared experts (DeepSeek-V3)."""
        return []

    # -- shared structure ------------------------------------------------------------------
    @property
    def hidden(self) -> int:
        return int(self.model["hidden_size"])

    def moe_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.model["layer_kinds"]) if k == "moe"]

    def expert_shape(self, part: str) -> tuple[int, int]:
        inter = int(self.model["moe"]["moe_intermediate_size"])
        return (self.hidden, inter) if part == "down" else (inter, self.hidden)

    def trunk(self) -> list[TrunkTensor]:
        """Canonical trunk tensors in file order (FORMAT.md §7), codebooks excluded."""
        m = self.model
        vocab, h = int(m["vocab_size"]), self.hidden
        out = [TrunkTensor("embed", "embed", (vocab, h), ("model.embed_tokens.weight",))]
        for layer, kind in enumerate(m["layer_kinds"]):
            p = f"model.layers.{layer}"
            out += [
                TrunkTensor(f"layers.{layer}.attn_norm", "norm", (h,),
                            (f"{p}.input_layernorm.weight",)),
                TrunkTensor(f"layers.{layer}.ffn_norm", "norm", (h,),
                            (f"{p}.post_attention_layernorm.weight",)),
            ]
            out += self.attention(layer)
            if kind == "moe":
                out.append(TrunkTensor(f"layers.{layer}.router", "router",
                                       (int(m["moe"]["num_experts"]), h),
                                       tuple(f"{q}.gate.weight" for q in self.moe_prefixes(layer))))
                out += self.moe_extra(layer)
            else:
                out += self.mlp(f"layers.{layer}.ffn", "dense_ffn", f"{p}.mlp",
                                int(m["dense_intermediate_size"]))
        out.append(TrunkTensor("final_norm", "norm", (h,), ("model.norm.weight",)))
        if not m["tie_word_embeddings"]:
            out.append(TrunkTensor("lm_head", "lm_head", (vocab, h), ("lm_head.weight",)))
        return out

    def mlp(self, name: str, cls: str, prefix: str, inter: int) -> list[TrunkTensor]:
        h = self.hidden
        return [TrunkTensor(f"{name}.{part}", cls, shape, (f"{prefix}.{part}_proj.weight",))
                for part, shape in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter)))]

    def linear(self, name: str, shape: tuple[int, ...], src: str, cls: str = "attn") -> TrunkTensor:
        return TrunkTensor(name, cls, shape, (src,))

    # -- experts ---------------------------------------------------------------------------
    def native_expert_names(self, layer: int, expert: int) -> dict[str, str]:
        """The per-expert checkpoint names `export` writes."""
        base = f"{self.moe_prefixes(layer)[0]}.experts.{expert}"
        return {part: f"{base}.{self.expert_names[part]}.weight" for part in EXPERT_PARTS}

    def expert_refs(self, layer: int, expert: int, names: Collection[str]) -> dict[str, SourceRef]:
        """Where expert `expert` of `layer` lives in a checkpoint holding `names`: per-expert
        tensors (the Hub layout) or fused `experts.gate_up_proj [E, 2I, H]` +
        `experts.down_proj [E, H, I]` (transformers ≥ 5 in-memory layout)."""
        inter = int(self.model["moe"]["moe_intermediate_size"])
        for prefix in self.moe_prefixes(layer):
            per = {part: f"{prefix}.experts.{expert}.{self.expert_names[part]}.weight"
                   for part in EXPERT_PARTS}
            if per["gate"] in names:
                return {part: SourceRef(n) for part, n in per.items()}
            fused = f"{prefix}.experts.gate_up_proj"
            if fused in names:
                return {"gate": SourceRef(fused, expert, (0, inter)),
                        "up": SourceRef(fused, expert, (inter, 2 * inter)),
                        "down": SourceRef(f"{prefix}.experts.down_proj", expert)}
        native = self.native_expert_names(layer, expert)["gate"]
        raise SourceError(f"tensor {native!r} missing from the checkpoint (nor a fused "
                          f"{self.moe_prefixes(layer)[0]}.experts.gate_up_proj)")

    def resolve(self, t: TrunkTensor, names: Collection[str]) -> SourceRef:
        for s in t.sources:
            if s in names:
                return SourceRef(s)
        raise SourceError(f"tensor {t.sources[0]!r} ({t.name}) missing from the checkpoint")

    def gqa_heads(self, hidden: int) -> dict:
        """num_attention_heads, num_key_value_heads and head_dim of a GQA config."""
        heads = self.cfg_int("num_attention_heads", field="num_attention_heads")
        default_dim = hidden // heads if heads else 0
        return {"num_attention_heads": heads,
                "num_key_value_heads": self.cfg_int("num_key_value_heads", default=heads,
                                                    field="num_key_value_heads"),
                "head_dim": self.cfg_int("head_dim", default=default_dim, field="head_dim")}

    def gqa(self, layer: int, qk_norm: bool) -> list[TrunkTensor]:
        m, h = self.model, self.hidden
        p, c = f"model.layers.{layer}.self_attn", f"layers.{layer}.attn"
        q = int(m["num_attention_heads"]) * int(m["head_dim"])
        kv = int(m["num_key_value_heads"]) * int(m["head_dim"])
        a = m["attention"]
        out = [self.linear(f"{c}.q", (q, h), f"{p}.q_proj.weight"),
               self.linear(f"{c}.k", (kv, h), f"{p}.k_proj.weight"),
               self.linear(f"{c}.v", (kv, h), f"{p}.v_proj.weight"),
               self.linear(f"{c}.o", (h, q), f"{p}.o_proj.weight")]
        if a.get("qkv_bias"):  # FORMAT.md §7 row order: after o
            out += [self.linear(f"{c}.{x}_bias", (n,), f"{p}.{x}_proj.bias", "bias")
                    for x, n in (("q", q), ("k", kv), ("v", kv))]
        if qk_norm:
            # per head ([head_dim], Qwen3, GLM) or over all heads at once (MiniMax-M2)
            full = a.get("qk_norm_scope") == "all_heads"
            dq, dk = ((q,), (kv,)) if full else ((int(m["head_dim"]),),) * 2
            out += [self.linear(f"{c}.q_norm", dq, f"{p}.q_norm.weight", "norm"),
                    self.linear(f"{c}.k_norm", dk, f"{p}.k_norm.weight", "norm")]
        return out

    def partial_rope(self, head_dim: int, factor: Any) -> int:
        """Rotated dims per head as transformers computes them (`int(head_dim * factor)`);
        the engine rotates whole pairs, so an odd count is refused."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                or not 0 < factor <= 1:
            raise SourceError(f"config.json: partial_rotary_factor must be a number in (0, 1], "
                              f"got {_short(factor)}")
        dim = int(head_dim * factor)
        if dim < 2 or dim > head_dim or dim % 2:
            raise SourceError(f"config.json: partial rotary embedding over {dim} of {head_dim} "
                              "head dims is not supported (an even count >= 2 is)")
        return dim


def _short(value: Any, limit: int = 80) -> str:
    """repr of an untrusted value, cut short so one message stays one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
