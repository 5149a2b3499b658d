"""Kimi K3 in the C engine: tiny K3-shaped checkpoints in the published layout (KDA with the
bounded decay and full-rank output gate, MLA without RoPE with an output gate, SiTU-GLU, latent
MoE with MXFP4 experts, AttnRes: tests/k3_checkpoint.py) converted by the real converter, against
the numpy forward pass written from docs/K3.md (tests/k3_forward.py, float64) on the exported
weights, over 80 positions of a prompt, with the routed experts as the engine computes a
prompt's (CODECS.md §3.6 on the container's codes, format/rvq_matvec.py). The reference's
activations are float64, the engine's float32, so now and then one of §3.6's 12-bit activation
roundings lands on the other side (measured 2026-12-02: 1 of 80 positions of the one-layer model,
8 of the full model's, the largest 7.7e-4 of max |logit|); every other position agrees within
rounding (median 2-3e-7)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from engine_invariants import (
    assert_pieces_equal_one_pass,
    assert_snapshot_continuation_equals_one_pass,
    assert_threads_and_chunks_bit_identical,
    within,
)
from k3_checkpoint import TEXT, make_k3_checkpoint
from k3_forward import K3Forward
from moepack.runtime.engine import Engine

N_POS = 80
CHUNK = 16
EXACT_KV = {"kv": "f32"}
LA = TEXT["linear_attn_config"]
VARIANTS = {
    "full": {},  # KDA, MLA, KDA, MLA; dense, then latent MoE; AttnRes banks at layers 0 and 3
    "no_routed_experts": {"first_k_dense_replace": 4},
    "kda_latent_moe": {"num_hidden_layers": 1, "attn_res_block_size": 1,
                       "first_k_dense_replace": 0,
                       "linear_attn_config": {**LA, "full_attn_layers": [], "kda_layers": [1]}},
}


def _build(d, text: dict):
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    make_k3_checkpoint(d / "src", **text)
    convert(d / "src", d / "m.moepack", Settings(expert_preset="rvq3-baseline", iters=2))
    export(d / "m.moepack", d / "hf")
    return d / "m.moepack", K3Forward(d / "hf", container=d / "m.moepack")


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("k3"), VARIANTS["full"])


@pytest.fixture(scope="module")
def k3_dense(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("k3_dense"), VARIANTS["no_routed_experts"])


# The full model amplifies any rounding-level change through its expert tables (f16 instead of
# f32 KV entries: median 1.6e-3, up to 0.62 of max |logit|; bench/linear_bound.py). A sequence
# split off the KDA sub-chunks, in the three tests below that use this, measured medians up to
# 2.7e-4 and a largest position of 5.0e-3 (token by token, threads 2); the bound is 4x that.
K3_CLOSE = within(median=1e-3, largest=2e-2)
# Without routed experts the pieces differ from one pass by the KDA chunk form's rounding, which
# this random model amplifies through the trunk's 16-bit activations (CODECS.md §2.4; the chaos
# floor below): median 3.2e-5, largest 2.7e-4 at 40 positions (2026-12-07), where the linear
# families' bound (LINEAR_CLOSE) holds the median to 5e-5.
K3_DENSE_CLOSE = within(median=2e-4, largest=1e-2)


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, TEXT["vocab_size"], n).tolist()


def _relative_errors(path, ref: K3Forward, toks: list[int]) -> np.ndarray:
    want = ref.logits(toks)
    with Engine(path, threads=2, chunk=CHUNK, **EXACT_KV) as e:
        got = e.logits(toks)
    assert got.shape == want.shape == (len(toks), TEXT["vocab_size"])
    return np.abs(got - want).max(-1) / np.abs(want).max()


# The reference rounds the activations where the engine's prompt products do (§2.4 in the trunk
# and the lm_head, §3.6 in the routed experts), so what is left is each tiny model's sensitivity
# to one of those roundings going the other way: the reference's own logits move this much when
# its activations are perturbed by 1e-7 (relative) before they are rounded (80 positions,
# 2026-12-07), median / largest: 5.0e-5 / 5.5e-4 without routed experts, 2.1e-8 / 4.6e-4 with KDA
# and latent experts, 2.8e-4 / 2.0e-3 for the full model. The engine measured 4.8e-5 / 3.7e-4,
# 7.9e-8 / 3.6e-4 and 3.2e-4 / 1.1e-3 (seed 0; 5.3e-5 / 2.8e-4, 1.1e-7 / 5.2e-4, 3.7e-4 / 2.0e-3
# with seed 1), since 2026-12-07 with the lm_head and decode's trunk in §2.4 too.
AGREES = {"no_routed_experts": (2e-4, 2e-3), "kda_latent_moe": (1e-5, 2e-3), "full": (1e-3, 4e-3)}


def _assert_agrees(err: np.ndarray, variant: str) -> None:
    median, largest = AGREES[variant]
    assert np.median(err) <= median, np.median(err)
    assert err.max() <= largest, (np.flatnonzero(err > largest), err.max())


@pytest.mark.parametrize("variant", ["no_routed_experts", "kda_latent_moe"])
def test_parts_match_the_numpy_forward(request, tmp_path, variant):
    path, ref = (request.getfixturevalue("k3_dense") if variant == "no_routed_experts"
                 else _build(tmp_path, VARIANTS[variant]))
    _assert_agrees(_relative_errors(path, ref, _tokens(N_POS, seed=0)), variant)


def test_full_model_matches_the_numpy_forward(k3):
    path, ref = k3
    _assert_agrees(_relative_errors(path, ref, _tokens(N_POS, seed=0)), "full")


def test_threads_and_chunk_sizes_bit_identical(k3):
    assert_threads_and_chunks_bit_identical(k3[0], _tokens(N_POS, seed=3), CHUNK, K3_CLOSE)


def test_continuation_equals_one_pass(k3):
    assert_pieces_equal_one_pass(k3[0], _tokens(40, seed=2), cuts=(7, 30), chunk=CHUNK,
                                 close=K3_CLOSE)


def test_chunk_form_within_the_bound_without_routed_experts(k3_dense):
    path, _ = k3_dense
    assert_threads_and_chunks_bit_identical(path, _tokens(N_POS, seed=3), CHUNK, K3_DENSE_CLOSE)
    assert_pieces_equal_one_pass(path, _tokens(40, seed=2), cuts=(7, 30), chunk=CHUNK,
                                 close=K3_DENSE_CLOSE)


def test_chat_continuation_from_a_snapshot_equals_one_pass(k3):
    """The KDA state, the MLA cache and the AttnRes bank all come back with the snapshot: turn 1
    ends inside an AttnRes block of the second layer group (22 tokens, 16-token chunks)."""
    assert_snapshot_continuation_equals_one_pass(k3[0], _tokens(22, seed=4), _tokens(19, seed=5),
                                                 CHUNK, K3_CLOSE)


def test_plan_counts_the_kda_state_and_the_mla_cache(k3):
    path, _ = k3
    la = TEXT["linear_attn_config"]
    qd = la["num_heads"] * la["head_dim"]
    conv = 3 * qd * (la["short_conv_kernel_size"] - 1)
    rec = la["num_heads"] * la["head_dim"] ** 2
    latent = TEXT["kv_lora_rank"] + TEXT["qk_rope_head_dim"]
    for kv, entry in (("f32", 4), ("f16", 2)):
        with Engine(path, threads=1, kv=kv) as e:
            p = e.plan()
        assert p["kv"] == kv
        assert p["state_bytes"] == len(la["kda_layers"]) * 4 * (conv + rec)
        per_token = (p["kv_bytes"] - p["state_bytes"]) / p["ctx"]
        assert per_token == 2 * latent * entry, (kv, per_token)  # two MLA layers


# K3 description fields: (change under manifest.model, field both validators name)
K3_TABLE: list[tuple[dict, str]] = [
    ({"activation.kind": "gelu"}, "activation.kind"),
    ({"activation.beta": 0}, "activation.beta"),
    ({"activation.beta": "1"}, "activation.beta"),
    ({"activation.linear_beta": -1.0}, "activation.linear_beta"),
    ({"attn_res.block_size": 0}, "attn_res.block_size"),
    ({"attn_res.block_size": 5}, "attn_res.block_size"),  # more than num_layers
    ({"moe.latent_size": 4}, "moe.latent_size"),
    ({"moe.latent_size": 64}, "moe.latent_size"),  # wider than hidden
    ({"linear_attention.gate_lower_bound": 0.0}, "linear_attention.gate_lower_bound"),
    ({"linear_attention.gate_lower_bound": "x"}, "linear_attention.gate_lower_bound"),
    ({"linear_attention.output_gate": "none"}, "linear_attention.output_gate"),
    ({"attention.output_gate": 1}, "attention.output_gate"),
]


def _k3_description() -> tuple[dict, dict]:
    from moepack.convert.plan import described

    cfg = {"architectures": ["KimiK3ForConditionalGeneration"], "text_config": dict(TEXT)}
    adapter = described(cfg)
    return json.loads(json.dumps(adapter.model)), adapter.config


@pytest.mark.parametrize("change,field", K3_TABLE, ids=[f"{f}-{c}" for c, f in K3_TABLE])
def test_k3_fields_refused_by_both(tmp_path, change: dict, field: str) -> None:
    from model_refusals import assert_refused_by_both

    assert_refused_by_both(tmp_path, *_k3_description(), change, field)
