"""GLM-5.3-Flash (transformers' `glm5_next`): a tiny random checkpoint built with transformers,
converted by the real converter and exported back. What is checked here is the converter side
(convert/adapters/glm5_next.py, FORMAT.md §7.2): the normalised description, every text tensor
under its canonical name, the export loading in transformers with the container's weights, and
bad configs refused in one line. Then the engine against transformers (float64, routed experts
at the container's stored codes): a KDA-only config (KDA layers, hyper-connections, clamped
SwiGLU) and a hybrid of KDA and DSA layers with the k-pool indexer, in two regimes.

Awkward sizes: hidden 36, KDA 2 heads of 10, indexer 4 heads of 12 with pools of 4, 6 experts in
2 groups, top-3; layers linear, DSA, linear, DSA with the second DSA layer running its own
indexer and a dense first layer. The hybrid: linear, DSA, DSA (shared), linear, DSA; indexer
16 heads of 12 (equal pool scores, where the tie rule would decide, are not the common case),
pools of 3 (they straddle the 16-token chunks), a random pool gate and position embedding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from dsa_checkpoints import (
    GLM5_KPOOL,
    GLM5_LIMIT,
    GLM5_MODELS,
    GLM5_SEEDS,
    GLM5_TEXT,
    GLM5_TOPK,
    glm5_next_config,
    make_glm5_next_checkpoint,
)
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import SourceError
from moepack.format.model_desc import ModelDescError, validate_model
from moepack.format.reader import Container
from tiny_models import write_tokenizer


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Source checkpoint (random weights, random norms), container, export."""
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from transformers import Glm5NextForConditionalGeneration

    d = tmp_path_factory.mktemp("glm5_next")
    torch.manual_seed(0)
    model = Glm5NextForConditionalGeneration(glm5_next_config())
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(d / "src")
    write_tokenizer(d / "src", 67)
    convert(d / "src", d / "m.moepack", Settings())
    export(d / "m.moepack", d / "hf")
    return d


def _source_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_description_normalises_glm5_next(built):
    with Container.open(built / "m.moepack") as c:
        m = c.manifest["model"]
        skipped = c.manifest["source"].get("skipped", [])
    assert m["arch"] == "glm5_next"
    assert m["layer_attention"] == ["linear", "full", "linear", "full"]
    assert m["layer_kinds"] == ["dense", "moe", "moe", "moe"]
    a = m["attention"]
    assert (a["qk_rope_head_dim"], a["rope"], m["head_dim"]) == (0, False, 6)
    assert a["latent_norm_eps"] == m["rms_norm_eps"]
    # layer 2 is linear (no indexer), so layer 3 must run its own: "shared" there is refused
    assert a["dsa"]["indexer_types"] == ["full"] * 4
    assert (a["dsa"]["kpool"], a["dsa"]["kpool_select_tail"]) == (4, True)
    assert m["linear_attention"]["gate_lower_bound"] == -3.0
    assert m["swiglu_limit"] == 0.5
    assert m["hyper_connections"] == {"mult": 4, "eps": 1e-6, "sinkhorn_iters": 7}
    assert m["moe"]["routed_scaling_factor"] == 1.5
    assert any("vision" in s for s in skipped)


def test_every_text_tensor_is_carried(built):
    src = _source_tensors(built / "src")
    text = {n for n in src if not n.startswith("model.visual.")
            and ".mlp.experts." not in n}
    adapter = adapter_for(json.loads((built / "src" / "config.json").read_text()))
    mapped = {t.sources[0]: t for t in adapter.trunk()}
    assert set(mapped) == text
    with Container.open(built / "m.moepack") as c:
        for native, t in mapped.items():
            got = c.tensor(t.name)
            want = src[native].float().numpy().reshape(got.shape)
            if t.cls in ("norm", "bias", "router"):  # kept f32: exact
                np.testing.assert_array_equal(got, want, err_msg=t.name)
            else:
                err = np.abs(got - want).max() / np.abs(want).max()
                assert err < 0.05, (t.name, err)


def test_export_loads_in_transformers_with_the_containers_weights(built):
    from transformers import Glm5NextForConditionalGeneration

    model, info = Glm5NextForConditionalGeneration.from_pretrained(
        built / "hf", dtype=torch.float32, output_loading_info=True)
    assert not [k for k in info["missing_keys"] if not k.startswith("model.visual.")]
    assert not info["unexpected_keys"]
    params = dict(model.named_parameters())
    with Container.open(built / "m.moepack") as c:
        adapter = adapter_for(c.manifest["source"]["config"])
        for t in adapter.trunk():
            mem = t.sources[-1] if t.sources[-1] in params else t.sources[0]
            if mem not in params:  # stacked in memory (the q/k/v convs)
                continue
            np.testing.assert_array_equal(params[mem].detach().numpy().reshape(-1),
                                          c.tensor(t.name).reshape(-1), err_msg=t.name)
    with torch.no_grad():
        logits = model(torch.tensor([[3, 5, 7, 11, 13, 2, 4, 6] * 3])).logits
    assert logits.shape == (1, 24, 67) and torch.isfinite(logits).all()


def test_in_memory_names_give_the_same_container(built, tmp_path):
    """transformers' in-memory names (fused experts, stacked q/k/v conv, `forget_gate.*`,
    `attn_hc.*`) read as the saved ones."""
    import shutil

    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from safetensors.torch import save_file
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForConditionalGeneration.from_pretrained(built / "src", dtype=torch.float32)
    mem = tmp_path / "mem"
    mem.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.language_model.layers.0.self_attn.conv1d.weight" in state
    save_file(state, mem / "model.safetensors", metadata={"format": "pt"})
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(built / "src" / f, mem / f)
    convert(mem, tmp_path / "m.moepack", Settings())
    with Container.open(built / "m.moepack") as a, Container.open(tmp_path / "m.moepack") as b:
        assert a.tensor_names() == b.tensor_names()
        for name in a.tensor_names():
            np.testing.assert_array_equal(a.tensor(name), b.tensor(name), err_msg=name)
        for layer in (1, 2, 3):
            np.testing.assert_array_equal(a.expert_part(layer, 5, "up"),
                                          b.expert_part(layer, 5, "up"))


N_POS, CHUNK = 80, 16
def _converted(d: Path, seed: int, flat_index: bool = False, **text) -> Path:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    convert(make_glm5_next_checkpoint(d / "src", seed, flat_index, **text), d / "m.moepack",
            Settings())
    return d / "m.moepack"


_ENGINE_BUILT: dict[str, tuple[Path, torch.nn.Module]] = {}


def engine_model(tmp_path_factory, name: str) -> tuple[Path, torch.nn.Module]:
    """GLM5_MODELS[name] converted and exported once per session, and transformers' reference
    (float64) on the export with its routed experts computed from the stored codes."""
    from moepack.convert.export import export
    from spec_experts import LayerExperts
    from transformers import Glm5NextForConditionalGeneration

    if name not in _ENGINE_BUILT:
        d = tmp_path_factory.mktemp(f"glm5_next_{name}")
        path = _converted(d, GLM5_SEEDS[name], **GLM5_MODELS[name])
        export(path, d / "hf")
        # float64: on these random weights transformers' own f32 pass is off its f64 pass by
        # up to 6e-5 of the largest logit at a few positions (docs/LEARNED.md), too close to
        # the bar
        ref = Glm5NextForConditionalGeneration.from_pretrained(d / "hf",
                                                               dtype=torch.float64).eval()
        with Container.open(path) as c:
            for i, layer in enumerate(ref.model.language_model.layers):
                if hasattr(layer.mlp, "experts"):
                    layer.mlp.experts.forward = _clamped_spec_experts(LayerExperts(c, i),
                                                                      GLM5_LIMIT)
        _ENGINE_BUILT[name] = path, ref
    return _ENGINE_BUILT[name]


@pytest.fixture(scope="module", params=list(GLM5_MODELS))
def model(request, tmp_path_factory):
    return engine_model(tmp_path_factory, request.param)


def _clamped_spec_experts(layer, limit: float):
    """transformers' clamped-SwiGLU experts with the engine's products (tests/spec_experts.py)."""
    def forward(hidden_states, top_k_index, top_k_weights):
        x = hidden_states.detach().float().numpy()
        idx, wts = top_k_index.numpy(), top_k_weights.detach().float().numpy()
        out = torch.zeros_like(hidden_states)
        prefill = len(x) > 1
        for e in np.unique(idx):
            tok, pos = np.nonzero(idx == e)
            g = torch.from_numpy(layer.product(int(e), "gate", x[tok], prefill)).clamp(max=limit)
            u = torch.from_numpy(layer.product(int(e), "up", x[tok], prefill)).clamp(-limit, limit)
            h = (torch.nn.functional.silu(g) * u).numpy()
            y = layer.product(int(e), "down", h, prefill)
            y = torch.from_numpy(y * wts[tok, pos, None]).to(out.dtype)
            out.index_add_(0, torch.from_numpy(tok), y)
        return out
    return forward


def _reference_logits(ref, toks: list[int]) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.tensor([toks]), use_cache=False).logits[0].numpy()


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 67, n).tolist()


def test_logits_match_transformers(model):
    from moepack.runtime.engine import Engine

    path, ref = model
    toks = _tokens(N_POS, 0)
    want = _reference_logits(ref, toks)
    with Engine(str(path), threads=2, chunk=CHUNK, kv="f32") as e:
        got = e.logits(toks)
    assert got.shape == want.shape == (N_POS, 67)
    err = np.abs(got - want).max()
    assert err <= 1e-4 * np.abs(want).max(), (err, np.abs(want).max())


def test_greedy_matches_transformers(model):
    """The engine's 32 greedy tokens are transformers' argmax after each prefix (or a near tie
    with it), read from one causal pass over prompt + reply (32 passes would cost ~30 s here)."""
    from engine_invariants import assert_greedy_agrees
    from moepack.runtime.engine import Engine

    path, ref = model
    prompt = _tokens(10, 1)
    with Engine(str(path), threads=2, kv="f32") as e:
        got = list(e.generate(prompt, 32))
    assert_greedy_agrees(got, _reference_logits(ref, prompt + got[:-1])[len(prompt) - 1:])


def test_threads_chunks_and_pieces_bit_identical(model):
    """Threads: the same bits; chunks and cuts off the KDA sub-chunks: within the bound."""
    from engine_invariants import (
        LINEAR_CLOSE,
        assert_pieces_equal_one_pass,
        assert_threads_and_chunks_bit_identical,
    )

    path, _ = model
    assert_threads_and_chunks_bit_identical(path, _tokens(N_POS, 3), CHUNK, LINEAR_CLOSE)
    assert_pieces_equal_one_pass(path, _tokens(40, 2), cuts=(7, 30), chunk=CHUNK,
                                 close=LINEAR_CLOSE)


def test_chat_continuation_from_a_snapshot_equals_one_pass(model):
    """The snapshot at 22 tokens lies inside a pool (positions 21..23): the reply completes it
    and the next one, turn 2 rewrites its positions and completes it again (and inside a KDA
    sub-chunk: within the bound)."""
    from engine_invariants import LINEAR_CLOSE, assert_snapshot_continuation_equals_one_pass

    path, _ = model
    assert_snapshot_continuation_equals_one_pass(path, _tokens(22, 8), _tokens(19, 9), CHUNK,
                                                 LINEAR_CLOSE)


def test_failed_call_changes_nothing(tmp_path_factory, tmp_path):
    from engine_invariants import assert_failed_call_changes_nothing

    path, _ = engine_model(tmp_path_factory, "hybrid_sparse")
    assert_failed_call_changes_nothing(path, tmp_path, 4, _tokens(1, 6), _tokens(40, 7), CHUNK)


def test_sparse_equals_dense_within_topk(tmp_path_factory):
    """Same weights, index_topk 12 vs 96: while at most 4 pools are complete (positions 0..13)
    every position is selected, the same bits; later positions differ, so the selection is
    really used."""
    from moepack.runtime.engine import Engine

    toks = _tokens(N_POS, 5)
    got = {}
    for regime in GLM5_TOPK:
        with Engine(str(engine_model(tmp_path_factory, f"hybrid_{regime}")[0]), threads=2,
                    chunk=CHUNK) as e:
            got[regime] = e.logits(toks)
    dense_end = (GLM5_TOPK["sparse"] // GLM5_KPOOL + 1) * GLM5_KPOOL - 1
    np.testing.assert_array_equal(got["sparse"][:dense_end], got["dense"][:dense_end])
    assert np.abs(got["sparse"][dense_end:] - got["dense"][dense_end:]).max() > 1e-3


@pytest.mark.parametrize("kv, entry", [("f32", 4), ("f16", 2)])
def test_plan_counts_the_indexer_caches(tmp_path_factory, kv, entry):
    """kv_bytes = the MLA latents of the 3 DSA layers, plus an index key and a pool gate score
    per position on each of the 2 full layers (the shared one has none), in the KV entry type,
    plus the KDA state; a pool's key takes its last position's key row."""
    from moepack.runtime.engine import plan

    path, _ = engine_model(tmp_path_factory, "hybrid_sparse")
    got = plan(str(path), ctx=64, kv=kv)
    per_token = entry * (3 * GLM5_TEXT["kv_lora_rank"] + 2 * 2 * GLM5_TEXT["index_head_dim"])
    assert got["kv_token_bytes"] == per_token
    assert got["kv_bytes"] == 64 * per_token + got["state_bytes"] > 64 * per_token


def test_equal_pool_scores_keep_the_lowest_pools(tmp_path):
    """An all-DSA model with zero indexer head weights: every pool scores 0, so the tie rule
    alone decides and keeps pools 0..3 (positions 0..11). At position 39 (13 pools complete,
    tail: 39 itself) the logits then depend on tokens 0..11 and 39 only: sequences that differ
    in between give the same bits there."""
    from moepack.runtime.engine import Engine

    path = _converted(tmp_path, 3, flat_index=True, num_hidden_layers=2,
                       mlp_layer_types=["dense", "sparse"], index_topk_pattern=None,
                       layer_types=["indexed_attention"] * 2, indexer_types=["full"] * 2,
                       index_n_heads=16, index_kpool=GLM5_KPOOL,
                       index_topk=GLM5_TOPK["sparse"])
    a, b = _tokens(40, 7), _tokens(40, 8)
    b[:12], b[-1] = a[:12], a[-1]
    with Engine(str(path), threads=2, chunk=CHUNK) as e:
        la, lb = e.logits(a), e.logits(b)
    np.testing.assert_array_equal(la[-1], lb[-1])
    assert np.abs(la[12:-1] - lb[12:-1]).max() > 1e-3  # the tokens in between do differ


def _adapter(**text) -> object:
    cfg = glm5_next_config(**text).to_dict()
    cfg["architectures"] = ["Glm5NextForConditionalGeneration"]
    return adapter_for(cfg)


@pytest.mark.parametrize("text, words", [
    (dict(qk_rope_head_dim=2), "qk_rope_head_dim must be 0"),
    (dict(index_topk_pattern="FSFS"), "indexer_types[1] is shared"),
    (dict(layer_types=["linear_attention", "sliding"] * 2), "layer_types must list"),
    (dict(linear_lower_bound=1.0), "linear_lower_bound must be a number < 0"),
    (dict(hc_mult=17), "'text_config.hc_mult' must be an integer in 1..16"),
    (dict(hc_sinkhorn_iters=0), "'text_config.hc_sinkhorn_iters' must be an integer in 1..1000"),
])
def test_bad_source_config_is_refused_in_one_line(text, words):
    cfg = glm5_next_config().to_dict()
    cfg["architectures"] = ["Glm5NextForConditionalGeneration"]
    cfg["text_config"].update(text)
    if "index_topk_pattern" in text:
        cfg["text_config"].pop("indexer_types")
    with pytest.raises(SourceError) as e:
        _ = adapter_for(cfg).model
    assert words in str(e.value) and "\n" not in str(e.value)


def _good() -> dict:
    return json.loads(json.dumps(_adapter().model))


@pytest.mark.parametrize("path, value, words", [
    ("swiglu_limit", -1.0, "swiglu_limit: must be a finite number > 0"),
    ("hyper_connections.mult", 0, "hyper_connections.mult: must be an integer in 1..16"),
    ("hyper_connections.eps", 0.0, "hyper_connections.eps: must be a finite number in (0, 1)"),
    ("hyper_connections", [4], "hyper_connections: must be null or an object"),
    ("attention.dsa.kpool", 3, "attention.dsa.kpool: must divide index_topk (8)"),
    ("attention.dsa.kpool", 9, "attention.dsa.kpool: must be an integer in 1..8"),
    ("attention.dsa.kpool_select_tail", "yes", "attention.dsa.kpool_select_tail"),
    ("attention.qk_rope_head_dim", -2, "attention.qk_rope_head_dim: must be an integer in 0.."),
])
def test_bad_description_is_refused(path, value, words):
    m = _good()
    validate_model(m)
    *parents, key = path.split(".")
    obj = m
    for p in parents:
        obj = obj[p]
    obj[key] = value
    with pytest.raises(ModelDescError) as e:
        validate_model(m)
    assert words in str(e.value)


def test_rope_part_of_zero_is_glm5_next_only():
    m = _good()
    m["arch"] = "kimi_linear"
    with pytest.raises(ModelDescError) as e:
        validate_model(m)
    assert "attention.qk_rope_head_dim: must be an integer in 2.." in str(e.value)


# attention.dsa changes of the `built` description (linear, full, linear, full) both validators
# refuse, naming the field
DSA_TABLE = [
    ({"kpool": 3}, "attention.dsa.kpool"),  # does not divide index_topk 8
    ({"kpool": 9}, "attention.dsa.kpool"),
    ({"kpool_select_tail": "yes"}, "attention.dsa.kpool_select_tail"),
    ({"indexer_types": ["full", "full", "full", "shared"]}, "attention.dsa.indexer_types[3]"),
    ({"indexer_types": ["full", "full", "shared", "full"]}, "attention.dsa.indexer_types[2]"),
]


@pytest.mark.parametrize("change, field", DSA_TABLE, ids=[str(c) for c, _ in DSA_TABLE])
def test_both_validators_refuse_bad_pools_and_shared_layers(tmp_path, change, field):
    """A shared layer must be a DSA layer right after a full one (3: after a linear layer; 2: a
    linear layer itself)."""
    from model_refusals import c_refusal, reseal_model

    m = _good()
    m["attention"]["dsa"].update(change)
    with pytest.raises(ModelDescError) as d:
        validate_model(m)
    assert d.value.field == field
    msg = c_refusal(reseal_model(tmp_path, m, glm5_next_config().to_dict()))
    assert f"manifest.model: {field}" in msg and "\n" not in msg, msg


def test_engine_refuses_pools_without_the_tail_in_one_line(tmp_path):
    """kpool_select_tail false is a valid description the engine does not run: transformers'
    query before the first complete pool attends to no position."""
    from model_refusals import c_refusal, reseal_model

    m = _good()
    m["attention"]["dsa"]["kpool_select_tail"] = False
    validate_model(m)
    msg = c_refusal(reseal_model(tmp_path, m, glm5_next_config().to_dict()))
    assert "kpool_select_tail false is not supported" in msg and "\n" not in msg, msg
