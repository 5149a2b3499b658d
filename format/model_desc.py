"""Validation of the normalised model description (FORMAT.md §7, `manifest.model`).

One set of rules, with the bounds on every count and size an untrusted config may declare, for
the converter (before any file is created) and the format reader; runtime/src/model_config.c
enforces the same rules in C (tests/test_hostile_config_rules.py runs one table through both).
The bounds are generous (real frontier models: ~100 layers, ~1000 experts, hidden 16k, vocab
300k) but keep every per-layer or per-expert structure a few MB; docs/CONVERT.md lists them.
"""

from __future__ import annotations

import math
from typing import Any

from moepack.format.limits import MAX_EXPERTS, MAX_JSON_DEPTH

MAX_LAYERS = 4096
MAX_TOTAL_EXPERTS = 1 << 20        # MoE layers x experts (real: ~25k)
MAX_HIDDEN = 1 << 17               # 131,072
MIN_HIDDEN = 8                     # the engine's kernels work on 8-vectors
MAX_VOCAB = 1 << 22                # 4,194,304
MAX_INTERMEDIATE = 1 << 20         # dense, expert and shared-expert FFN widths
MAX_HEADS = 4096
MAX_HEAD_DIM = 4096
MAX_ROPE_HEAD_DIM = 1024           # MLA's rotary part (the engine's stack buffer)
MAX_LORA_RANK = 1 << 16
MAX_POSITIONS = 1 << 30
MAX_GROUPS = 1024                  # MPM_MAX_GROUPS in runtime/src/model.h
MAX_SHARED_EXPERTS = 1024
ARCHS = ("mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "minimax_m2", "kimi_k25",
         "qwen3_next", "qwen3_5_moe", "deepseek_v32", "glm_moe_dsa", "kimi_linear",
         "kimi_k3", "glm5_next")
MAX_CONV_KERNEL = 64               # linear attention's causal conv (real: 4)

# Source files (config.json, model.safetensors.index.json, safetensors headers).
MAX_JSON_BYTES = 64 << 20          # config.json / index.json (a 100k-tensor index: ~10 MB)
SOURCE_JSON_DEPTH = MAX_JSON_DEPTH  # 64, as the container index
MAX_HEADER_BYTES = 100_000_000     # safetensors' own cap on a header
MAX_TENSORS = 1 << 22              # per checkpoint (real: ~300k with fp8 scales)
MAX_TENSOR_DIMS = 8

# Integer fields of the description (dotted paths under manifest.model): inclusive bounds.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, MAX_VOCAB),
    "hidden_size": (MIN_HIDDEN, MAX_HIDDEN),
    "num_layers": (1, MAX_LAYERS),
    "num_attention_heads": (1, MAX_HEADS),
    "num_key_value_heads": (1, MAX_HEADS),
    "head_dim": (2, MAX_HEAD_DIM),
    "max_position_embeddings": (1, MAX_POSITIONS),
    "dense_intermediate_size": (1, MAX_INTERMEDIATE),
    "attention.q_lora_rank": (1, MAX_LORA_RANK),
    "attention.kv_lora_rank": (1, MAX_LORA_RANK),
    "attention.qk_nope_head_dim": (1, MAX_HEAD_DIM),
    "attention.qk_rope_head_dim": (2, MAX_ROPE_HEAD_DIM),
    "attention.v_head_dim": (1, MAX_HEAD_DIM),
    "attention.rotary_dim": (2, MAX_HEAD_DIM),
    "attention.sliding_window": (1, (1 << 63) - 1),
    "attention.dsa.index_n_heads": (1, MAX_HEADS),
    "attention.dsa.index_head_dim": (2, MAX_HEAD_DIM),
    "attention.dsa.index_topk": (1, MAX_POSITIONS),
    "moe.num_experts": (1, MAX_EXPERTS),
    "moe.top_k": (1, MAX_EXPERTS),
    "moe.moe_intermediate_size": (1, MAX_INTERMEDIATE),
    "moe.n_group": (1, MAX_GROUPS),
    "moe.topk_group": (1, MAX_GROUPS),
    "moe.num_shared_experts": (0, MAX_SHARED_EXPERTS),
    "moe.shared_intermediate_size": (1, MAX_INTERMEDIATE),
    "rope_scaling.original_max_position_embeddings": (1, MAX_POSITIONS),
    "linear_attention.num_key_heads": (1, MAX_HEADS),
    "linear_attention.num_value_heads": (1, MAX_HEADS),
    "linear_attention.key_head_dim": (1, MAX_HEAD_DIM),
    "linear_attention.value_head_dim": (1, MAX_HEAD_DIM),
    "linear_attention.conv_kernel_size": (1, MAX_CONV_KERNEL),
    "linear_attention.num_heads": (1, MAX_HEADS),
    "linear_attention.head_dim": (1, MAX_HEAD_DIM),
    "attn_res.block_size": (1, MAX_LAYERS),
    "moe.latent_size": (MIN_HIDDEN, MAX_HIDDEN),
    "attention.dsa.kpool": (1, MAX_POSITIONS),
    "hyper_connections.mult": (1, 16),             # MAX_HC_MULT (real: 4)
    "hyper_connections.sinkhorn_iters": (1, 1000),  # MAX_SINKHORN_ITERS (real: 20)
}
MAX_HC_MULT = INT_BOUNDS["hyper_connections.mult"][1]
MAX_SINKHORN_ITERS = INT_BOUNDS["hyper_connections.sinkhorn_iters"][1]
# config.json keys that only shape the description (layer patterns): bounded the same way.
SOURCE_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "first_k_dense_replace": (0, MAX_LAYERS),
    "moe_layer_freq": (1, MAX_LAYERS),
    "decoder_sparse_step": (1, MAX_LAYERS),
}


class ModelDescError(ValueError):
    """`field` (a dotted path under manifest.model) breaks a rule."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _get(obj: dict, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def check_int(value: Any, field: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer within INT_BOUNDS[field] (or lo..hi), else ModelDescError."""
    blo, bhi = INT_BOUNDS.get(field, (0, (1 << 63) - 1))
    lo, hi = blo if lo is None else lo, bhi if hi is None else hi
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ModelDescError(field, f"must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _int(m: dict, field: str, hi: int | None = None, optional: bool = False) -> int | None:
    value = _get(m, field)
    if optional and value is None:
        return None
    return check_int(value, field, hi=hi)


def _number(m: dict, field: str, ok: Any, rule: str, default: float | None = None) -> float:
    value = _get(m, field)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not ok(value):
        raise ModelDescError(field, f"must be a finite number {rule}, got {value!r}")
    return float(value)


def _choice(m: dict, field: str, allowed: tuple[str, ...]) -> str:
    value = _get(m, field)
    if value not in allowed:
        raise ModelDescError(field, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def validate_model(model: Any) -> None:
    """Raise ModelDescError for the first rule `model` (manifest.model) breaks. The description
    is all an engine reads: never manifest.source.config (FORMAT.md §7)."""
    if not isinstance(model, dict):
        raise ModelDescError("model", "must be an object")
    _choice(model, "arch", ARCHS)
    for field in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings"):
        _int(model, field)
    if model["num_attention_heads"] % model["num_key_value_heads"]:
        raise ModelDescError("num_attention_heads", "must be a multiple of "
                             f"num_key_value_heads ({model['num_key_value_heads']})")
    if model["head_dim"] % 2:
        raise ModelDescError("head_dim", "must be even (rotary pairs)")
    _number(model, "rms_norm_eps", lambda v: 0 < v < 1, "in (0, 1)", default=1e-6)
    _number(model, "rope_theta", lambda v: v > 1, "> 1", default=10000.0)
    _rope_scaling(model)
    _bool(model, "rms_norm_unit_offset")
    _attention(model)
    _layers(model)
    _linear_attention(model)
    _moe(model)
    _k3_parts(model)
    _glm5_next_parts(model)


# rope_scaling (FORMAT.md §7): the normalised YaRN object; its optional numbers' rules
ROPE_TYPES = ("yarn",)
_YARN_NUMBERS: tuple[tuple[str, Any, str], ...] = (
    ("beta_fast", lambda v: v > 0, "> 0"),
    ("beta_slow", lambda v: v > 0, "> 0"),
    ("mscale", lambda v: v >= 0, ">= 0"),
    ("mscale_all_dim", lambda v: v >= 0, ">= 0"),
    ("attention_factor", lambda v: v > 0, "> 0"),
)


def _rope_scaling(m: dict) -> None:
    rs = m.get("rope_scaling")
    if rs is None:
        return
    if not isinstance(rs, dict):
        raise ModelDescError("rope_scaling", "must be null or an object")
    kind = rs.get("rope_type")
    if kind not in ROPE_TYPES:
        raise ModelDescError("rope_scaling", f"type {kind!r} is not supported (yarn)")
    _number(m, "rope_scaling.factor", lambda v: v > 0, "> 0")
    for key, ok, rule in _YARN_NUMBERS:
        if rs.get(key) is not None:
            _number(m, f"rope_scaling.{key}", ok, rule)
    _int(m, "rope_scaling.original_max_position_embeddings", optional=True)


def _bool(m: dict, field: str) -> None:
    """An optional flag: absent, null or a JSON boolean."""
    value = _get(m, field)
    if value is not None and not isinstance(value, bool):
        raise ModelDescError(field, f"must be true or false, got {value!r}")


def _attention(m: dict) -> None:
    kind = _choice(m, "attention.kind", ("gqa", "mla"))
    if kind == "gqa":
        # partial rotary embedding (GLM-4.5, MiniMax-M2); absent: the whole head
        rot = _int(m, "attention.rotary_dim", hi=m["head_dim"], optional=True)
        if rot is not None and rot % 2:
            raise ModelDescError("attention.rotary_dim", "must be even (rotary pairs)")
        _bool(m, "attention.qkv_bias")
        _bool(m, "attention.output_gate")
        _int(m, "attention.sliding_window", optional=True)  # absent or null: no window
        if _get(m, "attention.qk_norm_scope") is not None:
            _choice(m, "attention.qk_norm_scope", ("head", "all_heads"))
        return
    _bool(m, "attention.rope_interleave")
    _bool(m, "attention.rope")  # false: the rope dims are used unrotated (Kimi-Linear)
    _number(m, "attention.latent_norm_eps", lambda v: 0 < v < 1, "in (0, 1)",
            default=m.get("rms_norm_eps") or 1e-6)
    _int(m, "attention.q_lora_rank", optional=True)
    for field in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        _int(m, f"attention.{field}")
    # GLM-5.3-Flash's MLA has no rope part at all
    check_int(_get(m, "attention.qk_rope_head_dim"), "attention.qk_rope_head_dim",
              lo=0 if m["arch"] == "glm5_next" else None)
    if m["attention"]["qk_rope_head_dim"] % 2:
        raise ModelDescError("attention.qk_rope_head_dim", "must be even (rotary pairs)")
    _dsa(m)


def _dsa(m: dict) -> None:
    """`attention.dsa` (optional, MLA only): DeepSeek Sparse Attention's lightning indexer."""
    dsa = _get(m, "attention.dsa")
    if dsa is None:
        return
    if not isinstance(dsa, dict):
        raise ModelDescError("attention.dsa", "must be null or an object")
    if _get(m, "attention.q_lora_rank") is None:
        raise ModelDescError("attention.dsa", "needs attention.q_lora_rank (the indexer's "
                             "queries come from the q LoRA latent)")
    _int(m, "attention.dsa.index_n_heads")
    _int(m, "attention.dsa.index_topk")
    rope = m["attention"]["qk_rope_head_dim"]
    # the first qk_rope_head_dim dims of each indexer head are rotated
    check_int(dsa.get("index_head_dim"), "attention.dsa.index_head_dim", lo=rope)
    if not isinstance(dsa.get("rope_interleave"), bool):
        raise ModelDescError("attention.dsa.rope_interleave",
                             f"must be true or false, got {dsa.get('rope_interleave')!r}")
    types = dsa.get("indexer_types")
    if not isinstance(types, list) or len(types) != m["num_layers"]:
        raise ModelDescError("attention.dsa.indexer_types",
                             f"must list num_layers ({m['num_layers']}) entries")
    for i, t in enumerate(types):
        if t not in ("full", "shared"):
            raise ModelDescError(f"attention.dsa.indexer_types[{i}]",
                                 f"must be full or shared, got {t!r}")
    if types[0] != "full":
        raise ModelDescError("attention.dsa.indexer_types[0]",
                             "must be full (a shared layer reuses an earlier full layer's "
                             "selection)")


def _layers(m: dict) -> None:
    kinds = m.get("layer_kinds")
    if not isinstance(kinds, list) or len(kinds) != m["num_layers"]:
        raise ModelDescError("layer_kinds", f"must list num_layers ({m['num_layers']}) kinds")
    for i, k in enumerate(kinds):
        if k not in ("moe", "dense"):
            raise ModelDescError(f"layer_kinds[{i}]", f"must be moe or dense, got {k!r}")
    if "dense" in kinds:
        _int(m, "dense_intermediate_size")


def _linear_attention(m: dict) -> None:
    """`layer_attention` (optional: absent means every layer full attention) and, when any
    layer is linear, the `linear_attention` object (Gated DeltaNet or KDA)."""
    kinds = m.get("layer_attention")
    if kinds is None:
        return
    if not isinstance(kinds, list) or len(kinds) != m["num_layers"]:
        raise ModelDescError("layer_attention",
                             f"must list num_layers ({m['num_layers']}) kinds")
    for i, k in enumerate(kinds):
        if k not in ("full", "linear"):
            raise ModelDescError(f"layer_attention[{i}]", f"must be full or linear, got {k!r}")
    if "linear" not in kinds:
        return
    if not isinstance(m.get("linear_attention"), dict):
        raise ModelDescError("linear_attention", "must be an object")
    if _choice(m, "linear_attention.kind", ("gated_deltanet", "kda")) == "kda":
        for field in ("num_heads", "head_dim", "conv_kernel_size"):  # KDA: q, k, v alike
            _int(m, f"linear_attention.{field}")
        return
    if m["attention"]["kind"] != "gqa":
        raise ModelDescError("layer_attention", "gated_deltanet layers need attention.kind gqa")
    _choice(m, "linear_attention.projection", ("grouped_qkvz", "split"))
    nk = _int(m, "linear_attention.num_key_heads")
    nv = _int(m, "linear_attention.num_value_heads")
    assert nk is not None and nv is not None
    if nv % nk:
        raise ModelDescError("linear_attention.num_value_heads",
                             f"must be a multiple of num_key_heads ({nk})")
    for field in ("key_head_dim", "value_head_dim", "conv_kernel_size"):
        _int(m, f"linear_attention.{field}")


def _moe(m: dict) -> None:
    if not isinstance(m.get("moe"), dict):
        raise ModelDescError("moe", "must be an object")
    experts = _int(m, "moe.num_experts")
    assert experts is not None
    n_moe = m["layer_kinds"].count("moe")
    if n_moe * experts > MAX_TOTAL_EXPERTS:
        raise ModelDescError("moe.num_experts", f"{experts} experts x {n_moe} MoE layers exceeds "
                             f"{MAX_TOTAL_EXPERTS:,} experts in all")
    top_k = _int(m, "moe.top_k", hi=experts)
    _int(m, "moe.moe_intermediate_size")
    groups = m["moe"].get("n_group")
    groups = 1 if groups is None else check_int(groups, "moe.n_group")
    kept = m["moe"].get("topk_group")
    kept = 1 if kept is None else check_int(kept, "moe.topk_group", hi=groups)
    if experts % groups:
        raise ModelDescError("moe.n_group", f"must divide num_experts ({experts}), got {groups}")
    if groups > 1 and top_k and top_k > kept * (experts // groups):
        raise ModelDescError("moe.top_k", f"{top_k} exceeds the {kept * (experts // groups)} "
                             "experts that topk_group groups hold")
    shared = m["moe"].get("num_shared_experts")
    if shared is not None and check_int(shared, "moe.num_shared_experts"):
        _int(m, "moe.shared_intermediate_size")
    _bool(m, "moe.shared_expert_gate")
    if _get(m, "moe.shared_expert_gate") and not shared:
        raise ModelDescError("moe.shared_expert_gate", "needs num_shared_experts >= 1")
    _choice(m, "moe.scoring", ("softmax", "sigmoid"))
    _number(m, "moe.routed_scaling_factor", lambda v: v > 0, "> 0", default=1.0)


def _k3_parts(m: dict) -> None:
    """SiTU activation, block attention residuals, the routed experts' latent width, KDA's
    bounded decay gate and full-rank output gate, MLA's output gate."""
    if m.get("activation") is not None:
        if not isinstance(m["activation"], dict):
            raise ModelDescError("activation", "must be null or an object")
        if _choice(m, "activation.kind", ("silu", "situ")) == "situ":
            _number(m, "activation.beta", lambda v: v > 0, "> 0")
            _number(m, "activation.linear_beta", lambda v: v >= 0, ">= 0", default=0.0)
    if m.get("attn_res") is not None:
        if not isinstance(m["attn_res"], dict):
            raise ModelDescError("attn_res", "must be null or an object")
        _int(m, "attn_res.block_size", hi=m["num_layers"])
    _int(m, "moe.latent_size", hi=m["hidden_size"], optional=True)  # the engine's buffers
    la = m.get("linear_attention")
    if isinstance(la, dict) and la.get("gate_lower_bound") is not None:
        _number(m, "linear_attention.gate_lower_bound", lambda v: v < 0, "< 0")
    if isinstance(la, dict) and la.get("output_gate") is not None:
        _choice(m, "linear_attention.output_gate", ("low_rank", "full_rank"))
    _bool(m, "attention.output_gate")


def _glm5_next_parts(m: dict) -> None:
    """Clamped SwiGLU, hyper-connection streams, the DSA indexer's k-pools (FORMAT.md §7.2)."""
    if m.get("swiglu_limit") is not None:
        _number(m, "swiglu_limit", lambda v: v > 0, "> 0")
    hc = m.get("hyper_connections")
    if hc is not None:
        if not isinstance(hc, dict):
            raise ModelDescError("hyper_connections", "must be null or an object")
        _int(m, "hyper_connections.mult")
        _number(m, "hyper_connections.eps", lambda v: 0 < v < 1, "in (0, 1)")
        _int(m, "hyper_connections.sinkhorn_iters")
    dsa = _get(m, "attention.dsa") if m["attention"]["kind"] == "mla" else None  # GQA: unread
    if isinstance(dsa, dict) and dsa.get("kpool") is not None:
        pool = _int(m, "attention.dsa.kpool", hi=dsa["index_topk"])
        assert pool is not None
        if dsa["index_topk"] % pool:
            raise ModelDescError("attention.dsa.kpool",
                                 f"must divide index_topk ({dsa['index_topk']}), got {pool}")
        _bool(m, "attention.dsa.kpool_select_tail")
    if m["arch"] == "glm5_next" and isinstance(dsa, dict):
        _glm5_next_indexers(m["layer_attention"] if m.get("layer_attention") else
                            ["full"] * m["num_layers"], dsa["indexer_types"])


def _glm5_next_indexers(kinds: list[str], types: list[str]) -> None:
    """A `shared` layer reuses the selection of the layer right before it, which must be a full
    DSA layer: transformers hands a selection only to the next layer."""
    for i, t in enumerate(types):
        if t == "shared" and (kinds[i] == "linear" or kinds[i - 1] == "linear"
                              or types[i - 1] != "full"):
            raise ModelDescError(f"attention.dsa.indexer_types[{i}]",
                                 "must be full: a shared layer must be a DSA layer right after "
                                 "a full DSA layer (glm5_next)")
