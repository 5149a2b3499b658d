"""DeepSeek Sparse Attention (DeepSeek-V3.2 `deepseek_v32`, GLM-5 `glm_moe_dsa`): the C engine
against transformers on the container's dequantised weights, as tests/test_runtime_models.py
does for the other families (routed experts patched to the engine's products,
tests/spec_experts.py).

Each family is built twice from the same random weights: `index_topk` 8 (sparse: from position 8
on each query attends to 8 indexer-selected positions) and 128 (dense: every context of the test
is within top-k, so DSA is plain MLA). The indexer has 16 heads of 12 dims (4 of them rotated),
so equal index scores, where the tie rule would decide, are not the common case. The prompt is
fed in chunks of 16 tokens (Engine(chunk=16)), 80 positions: longer than one chunk. Comparisons
with transformers keep the KV cache in f32 (kv="f32"); the other tests use the default.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from dsa_checkpoints import DSA_COMMON, DSA_FAMILIES, dsa_config, make_dsa_checkpoint
from engine_invariants import assert_greedy_agrees
from kernel_paths import prefill_then_decode, runnable_kernels
from model_refusals import c_refusal, reseal_model
from moepack.format.reader import Container
from moepack.runtime.engine import Engine
from spec_experts import use_spec_expert_numerics

N_POS = 80
CHUNK = 16
TOPK = {"sparse": 8, "dense": 128}


_BUILT: dict[tuple[str, str], Path] = {}


def built(tmp_path_factory, arch: str, regime: str) -> Path:
    """Converted and exported once per session: the folder holding m.moepack and hf/."""
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    if (arch, regime) not in _BUILT:
        d = tmp_path_factory.mktemp(f"{arch}_{regime}")
        make_dsa_checkpoint(arch, d / "src", TOPK[regime])
        convert(d / "src", d / "m.moepack", Settings())
        export(d / "m.moepack", d / "hf")
        _BUILT[arch, regime] = d
    return _BUILT[arch, regime]


@pytest.fixture(scope="module", params=[(a, r) for a in DSA_FAMILIES for r in TOPK],
                ids=lambda p: "-".join(p))
def model(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    arch, regime = request.param
    d = built(tmp_path_factory, arch, regime)
    ref = AutoModelForCausalLM.from_pretrained(d / "hf", dtype=torch.float32).eval()
    use_spec_expert_numerics(ref, d / "m.moepack")
    return arch, regime, d / "m.moepack", ref


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 67, n).tolist()


def test_container_describes_the_indexer(model):
    arch, regime, path, _ = model
    with Container.open(path) as c:
        dsa = c.manifest["model"]["attention"]["dsa"]
        names = set(c.tensor_names())
    assert dsa["index_topk"] == TOPK[regime] and dsa["index_n_heads"] == 16
    assert dsa["rope_interleave"] is (arch == "glm_moe_dsa")
    full = [i for i, t in enumerate(dsa["indexer_types"]) if t == "full"]
    assert full == ([0, 3] if arch == "glm_moe_dsa" else [0, 1, 2])
    for layer in range(len(dsa["indexer_types"])):  # shared layers carry no indexer
        assert (f"layers.{layer}.attn.idx_q" in names) is (layer in full)


def test_logits_match_transformers(model):
    arch, regime, path, ref = model
    toks = _tokens(N_POS, 0)
    with torch.no_grad():
        want = ref(torch.tensor([toks])).logits[0].numpy()
    with Engine(str(path), threads=2, chunk=CHUNK, kv="f32") as e:
        got = e.logits(toks)
    assert got.shape == want.shape == (N_POS, 67)
    err = np.abs(got - want).max()
    assert err <= 1e-4 * np.abs(want).max(), (arch, regime, err, np.abs(want).max())


def test_one_and_two_threads_bit_identical(model):
    _, _, path, _ = model
    toks = _tokens(N_POS, 3)
    with Engine(str(path), threads=1, chunk=CHUNK) as e1, \
            Engine(str(path), threads=2, chunk=7) as e2:
        np.testing.assert_array_equal(e1.logits(toks), e2.logits(toks))


def test_greedy_generation_matches_transformers(model):
    _, _, path, ref = model
    prompt = _tokens(10, 1)
    with Engine(str(path), threads=2, chunk=CHUNK, kv="f32") as e:
        got = list(e.generate(prompt, 32))
    with torch.no_grad():
        ref_logits = ref(torch.tensor([prompt + got[:-1]])).logits[0, len(prompt) - 1:]
    assert_greedy_agrees(got, ref_logits.float().numpy())


def test_truncate_and_continue_equals_one_pass(model):
    """The indexer keys are cached per position like the latents: a prefix kept and the rest fed
    again gives the one-pass logits."""
    _, _, path, _ = model
    toks = _tokens(40, 4)
    with Engine(str(path), threads=1, chunk=CHUNK) as e:
        full = e.logits(toks)
        e.truncate(13)
        last = e.feed(toks[13:])
    np.testing.assert_array_equal(last, full[-1])


@pytest.mark.parametrize("arch", list(DSA_FAMILIES))
def test_sparse_equals_dense_within_topk(tmp_path_factory, arch):
    """Same weights, index_topk 8 vs 128: positions 0..7 (context <= 8) give the same bits;
    later positions differ, so the selection is really used."""
    sparse = built(tmp_path_factory, arch, "sparse") / "m.moepack"
    dense = built(tmp_path_factory, arch, "dense") / "m.moepack"
    toks = _tokens(N_POS, 5)
    with Engine(str(sparse), threads=2, chunk=CHUNK) as s, \
            Engine(str(dense), threads=2, chunk=CHUNK) as d:
        sparse_logits, dense_logits = s.logits(toks), d.logits(toks)
    np.testing.assert_array_equal(sparse_logits[:8], dense_logits[:8])
    assert np.abs(sparse_logits[8:] - dense_logits[8:]).max() > 1e-3


@pytest.mark.parametrize("kv, entry", [("f32", 4), ("f16", 2)])
def test_plan_counts_the_indexer_key_cache(tmp_path_factory, kv, entry):
    """kv_bytes = the MLA latents plus one indexer key per position on each full layer (GLM's
    FSSF has 2 full layers of 4), both in the KV entry type: 4 bytes (f32) or 2 (f16)."""
    from moepack.runtime.engine import plan

    path = built(tmp_path_factory, "glm_moe_dsa", "sparse") / "m.moepack"
    got = plan(str(path), ctx=64, kv=kv)
    latent = DSA_COMMON["kv_lora_rank"] + DSA_COMMON["qk_rope_head_dim"]
    assert got["kv_bytes"] == 64 * entry * (4 * latent + 2 * DSA_COMMON["index_head_dim"])
    assert got["kv_token_bytes"] * 64 == got["kv_bytes"]


def _described(arch: str, **change):
    from moepack.convert.plan import described

    cfg = dsa_config(arch, 8).to_dict()
    cfg["architectures"] = [{"deepseek_v32": "DeepseekV32ForCausalLM",
                             "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[arch]]
    for key in ("indexer_types", "index_topk_pattern"):  # derived again from `change`
        cfg.pop(key, None)
    return described({**cfg, **change})


@pytest.mark.parametrize("source", [dict(index_topk_pattern="FSFS"),
                                    dict(index_topk_freq=2, index_skip_topk_offset=1),
                                    dict(index_topk_freq=3)])
def test_glm_indexer_types_as_transformers_derives_them(source):
    from transformers import GlmMoeDsaConfig

    kw = {**DSA_COMMON, "num_hidden_layers": 4, **source}
    want = GlmMoeDsaConfig(**kw).indexer_types
    assert _described("glm_moe_dsa", **source).model["attention"]["dsa"]["indexer_types"] == want


@pytest.mark.parametrize("change,message", [
    (dict(indexer_types=["full", "shared", "sparse", "full"]), "'indexer_types' must list"),
    (dict(index_topk_pattern="FSXF"), "'index_topk_pattern' must be letters"),
    (dict(index_topk_pattern="SFFF"), "indexer_types[0]"),
    (dict(q_lora_rank=None), "q_lora_rank is required"),
    (dict(index_topk=0), "'index_topk' must be an integer"),
])
def test_bad_sources_are_refused_in_one_line(change, message):
    from moepack.convert.errors import ConvertError

    with pytest.raises(ConvertError) as e:
        _described("glm_moe_dsa", **change)
    assert message in str(e.value) and "\n" not in str(e.value)


# manifest.model.attention.dsa changes both validators refuse, naming the field
DSA_TABLE = [
    ({"index_n_heads": 0}, "attention.dsa.index_n_heads"),
    ({"index_topk": 0}, "attention.dsa.index_topk"),
    ({"index_head_dim": 3}, "attention.dsa.index_head_dim"),  # < qk_rope_head_dim 4
    ({"rope_interleave": "yes"}, "attention.dsa.rope_interleave"),
    ({"indexer_types": ["full"]}, "attention.dsa.indexer_types"),
    ({"indexer_types": ["full", "dense", "full"]}, "attention.dsa.indexer_types[1]"),
    ({"indexer_types": ["shared", "full", "full"]}, "attention.dsa.indexer_types[0]"),
]


@pytest.mark.parametrize("change,field", DSA_TABLE, ids=[f for _, f in DSA_TABLE])
def test_both_validators_refuse_bad_dsa(tmp_path, change, field):
    from moepack.format.model_desc import ModelDescError, validate_model

    adapter = _described("deepseek_v32")
    model = json.loads(json.dumps(adapter.model))
    model["attention"]["dsa"].update(change)
    with pytest.raises(ModelDescError) as d:
        validate_model(model)
    assert d.value.field == field
    msg = c_refusal(reseal_model(tmp_path, model, adapter.config))
    assert f"manifest.model: {field}" in msg, msg


def test_dsa_needs_a_q_lora(tmp_path):
    from moepack.format.model_desc import ModelDescError, validate_model

    adapter = _described("deepseek_v32")
    model = json.loads(json.dumps(adapter.model))
    model["attention"]["q_lora_rank"] = None
    with pytest.raises(ModelDescError, match="attention.dsa"):
        validate_model(model)
    assert "attention.dsa needs attention.q_lora_rank" in c_refusal(
        reseal_model(tmp_path, model, adapter.config))


@pytest.mark.parametrize("arch", list(DSA_FAMILIES))
def test_every_kernel_path_bit_identical(tmp_path_factory, arch):
    """The indexer's projections go through the same kernels as the trunk: every path this CPU
    runs gives the auto path's logits bit for bit (sparse regime, 40 positions), and the
    decode steps after them."""
    path = str(built(tmp_path_factory, arch, "sparse") / "m.moepack")
    toks = _tokens(40, 6)
    with Engine(path, threads=2, chunk=CHUNK) as e:
        base = prefill_then_decode(e, toks)
    for name in runnable_kernels():
        for threads in (1, 2):
            with Engine(path, threads=threads, chunk=CHUNK, kernels=name) as e:
                got = prefill_then_decode(e, toks)
            np.testing.assert_array_equal(got, base, err_msg=f"{name} threads={threads}")


@pytest.mark.parametrize("arch", list(DSA_FAMILIES))
def test_native_names_are_what_save_pretrained_writes(tmp_path_factory, arch):
    """Every tensor save_pretrained wrote is one the adapter maps (the indexer's included, on
    full layers only), and nothing else: export writes these names back."""
    from moepack.convert.adapters import adapter_for
    from moepack.convert.source import Checkpoint

    ck = Checkpoint(built(tmp_path_factory, arch, "sparse") / "src")
    a = adapter_for(ck.config)
    native = {t.sources[0] for t in a.trunk()}
    for layer in a.moe_layers():
        for e in range(a.model["moe"]["num_experts"]):
            native |= set(a.native_expert_names(layer, e).values())
    assert native == set(ck.tensors)


def test_ties_select_the_lowest_positions(tmp_path):
    """Zero indexer head weights: every score is 0, so the tie rule alone decides and keeps
    positions 0..7 for every later query. Then the logits at position p >= 8 depend on tokens
    0..7 and p only: sequences that differ in between give the same bits there (with any other
    rule the in-between tokens would be attended to)."""
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    make_dsa_checkpoint("deepseek_v32", tmp_path / "src", 8, flat_index=True)
    convert(tmp_path / "src", tmp_path / "m.moepack", Settings())
    a, b = _tokens(40, 7), _tokens(40, 8)
    b[:8], b[-1] = a[:8], a[-1]
    with Engine(str(tmp_path / "m.moepack"), threads=2, chunk=CHUNK) as e:
        la, lb = e.logits(a), e.logits(b)
    np.testing.assert_array_equal(la[-1], lb[-1])
    assert np.abs(la[8:-1] - lb[8:-1]).max() > 1e-3  # the tokens in between do differ


def test_real_configs_describe_as_expected():
    """docs/configs (the published config.json values): GLM-5's indexer interleaved on all 78
    layers, DeepSeek-V3.2's half-split with YaRN; both keep latent norms at eps 1e-6."""
    from moepack.convert.plan import described

    configs = Path(__file__).resolve().parent.parent / "docs" / "configs"
    glm = described(json.loads((configs / "GLM-5.json").read_text())).model
    v32 = described(json.loads((configs / "DeepSeek-V3.2.json").read_text())).model
    assert glm["attention"]["dsa"] == {"index_n_heads": 32, "index_head_dim": 128,
                                       "index_topk": 2048, "rope_interleave": True,
                                       "indexer_types": ["full"] * 78}
    assert v32["attention"]["dsa"]["rope_interleave"] is False
    assert v32["attention"]["dsa"]["index_n_heads"] == 64
    assert v32["rope_scaling"]["factor"] == 40
    assert glm["attention"]["latent_norm_eps"] == v32["attention"]["latent_norm_eps"] == 1e-6
    assert glm["rms_norm_eps"] == 1e-5
