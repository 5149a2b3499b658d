"""The C engine against transformers on the container's dequantised weights, per architecture.

Each tiny random checkpoint (tests/tiny_models.py) is converted with the real converter, exported
to a float32 Hugging Face checkpoint (`moepack export`) and loaded by transformers; the engine
reads the container itself (rvq experts, trunk codecs as below). The engine's expert products are
CODECS.md §3.6's prefill product for a call of several tokens and §3.5's int8-table product
(about 1 % from Ŵx) for a call of one, so the transformers expert modules are patched to compute
each routed expert's gate, up and down projection with the numpy references of those
(moepack.format.rvq_matvec, tests/spec_experts.py) on the container's codes; transformers still
does attention, norms, routing, the activation and shared experts. Tolerance:
max |Δlogit| <= 1e-4 x max |logit| over 80 positions fed in chunks of 16 (CHUNK: the chunk the
engine plans for these tiny models is the whole prompt); each of 32 greedy tokens is transformers'
argmax after the same prefix or within 1e-4 x max |logit| of it (a near tie); threads and chunk
sizes give the same bits; a turn snapshot's continuation is one pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_invariants import (
    LINEAR_CLOSE,
    assert_greedy_agrees,
    assert_pieces_equal_one_pass,
    assert_snapshot_continuation_equals_one_pass,
    assert_threads_and_chunks_bit_identical,
)
from moepack.convert.quant import TRUNK_CODECS
from moepack.format.reader import Container
from moepack.runtime.engine import Engine, EngineError
from spec_experts import use_spec_expert_numerics
from tiny_models import make_checkpoint, model_class

# Larger than the defaults where it matters: top-2 routing for Mixtral (its real setting), and
# max_position_embeddings 128 so that 80 positions fit. Qwen3/DeepSeek keep their awkward sizes
# (hidden 36 / 28: partial 8-vectors in the codes).
OVERRIDES = {
    "mixtral": dict(hidden_size=64, intermediate_size=40, num_local_experts=4,
                    num_experts_per_tok=2, max_position_embeddings=128),
    "qwen3_moe": dict(max_position_embeddings=128),
    "deepseek_v3": dict(max_position_embeddings=128),
    # DeepSeek with YaRN RoPE scaling (factor 4 over 32 original positions) and mscale
    "deepseek_v3_yarn": dict(max_position_embeddings=128, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # every trunk codec the engine multiplies in place (defaults: q6, f32 norms, f16 codebooks)
    "mixtral_codecs": dict(max_position_embeddings=128, tie_word_embeddings=False),
    "deepseek_v3_codecs": dict(max_position_embeddings=128),
    # the default q6 trunk with a tied embedding: both the row gather and the LM head matvec
    # (hidden 36: a 4-column tail in the last group of 32)
    "qwen3_moe_q6": dict(max_position_embeddings=128, tie_word_embeddings=True),
    # sliding-window attention (window 16 < 80 positions)
    "mixtral_window": dict(max_position_embeddings=128, sliding_window=16),
    # GLM-4.5: q/k/v biases, per-head qk-norm, RoPE on 6 of 12 head dims, grouped sigmoid router
    "glm4_moe": dict(max_position_embeddings=128),
    # MiniMax-M2: full-width q/k norm, RoPE on 4 of 10 head dims, sigmoid + bias, no groups
    "minimax_m2": dict(max_position_embeddings=128),
    # Kimi K2.5: DeepSeek-V3 under text_config, INT4 pack-quantized experts, vision tower skipped
    "kimi_k25": dict(max_position_embeddings=128),
    # Qwen3-Next: Gated DeltaNet layers (conv + recurrent state, chunk form), gated full
    # attention with partial RoPE, (1 + w) norms, sigmoid-gated shared expert
    "qwen3_next": dict(max_position_embeddings=128),
    # Qwen3.5-MoE: the same under text_config, split DeltaNet projections, vision tower skipped
    "qwen3_5_moe": dict(max_position_embeddings=128),
}
# Compared on logits only (generation and the cache invariants add nothing the variants above
# do not already cover)
LOGITS_ONLY = {
    # GQA with YaRN and both mscales: the attention factor is their ratio, and unlike MLA the
    # softmax scale stays head_dim^-0.5 (no mscale_all_dim^2)
    "qwen3_moe_yarn": dict(max_position_embeddings=128, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "mscale": 1.0, "mscale_all_dim": 0.5}),
}
# checkpoint options beyond the config (tiny_models.make_checkpoint)
SOURCE = {"kimi_k25": dict(int4_group=4)}
ARCHS = ("mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "minimax_m2", "kimi_k25",
         "qwen3_next", "qwen3_5_moe")
TRUNK = {
    "mixtral": (("attn", "q8"), ("embed", "q8"), ("lm_head", "q8")),  # the q8 trunk
    "mixtral_codecs": (("attn", "q4-zp"), ("embed", "bf16"), ("lm_head", "f16"),
                       ("norm", "bf16"), ("router", "f16"), ("codebook", "f32")),
    "deepseek_v3_codecs": (("attn", "q4-g16"), ("dense_ffn", "q4-zp-g64"),
                           ("shared_expert", "q4"), ("embed", "f16"), ("lm_head", "bf16"),
                           ("bias", "f16")),
    "qwen3_moe_q6": (("attn", "q6"), ("dense_ffn", "q6"), ("embed", "q6")),
}
N_POS = 80
CHUNK = 16  # prompt tokens per forward pass: 80 positions cross four chunk boundaries


def build(tmp_path_factory, name: str):
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    arch = next(a for a in ARCHS if name.startswith(a))
    d = tmp_path_factory.mktemp(name)
    overrides = {**OVERRIDES, **LOGITS_ONLY}[name]
    make_checkpoint(arch, d / "src", **SOURCE.get(name, {}), **overrides)
    convert(d / "src", d / "m.moepack", Settings(trunk=TRUNK.get(name, ())))
    with Container.open(d / "m.moepack") as c:  # the codecs asked for are the ones stored
        for cls, codec in TRUNK.get(name, ()):
            assert c.manifest["codecs"][cls] == TRUNK_CODECS[codec], (cls, codec)
    export(d / "m.moepack", d / "hf")
    return d


def loaded(tmp_path_factory, name: str):
    """(name, container, transformers' model on its export with the spec's expert numerics)."""
    d = build(tmp_path_factory, name)
    cls = model_class(next(a for a in ARCHS if name.startswith(a)))
    ref = cls.from_pretrained(d / "hf", dtype=torch.float32).eval()
    use_spec_expert_numerics(ref, d / "m.moepack")
    return name, d / "m.moepack", ref


@pytest.fixture(scope="module", params=list(OVERRIDES))
def model(request, tmp_path_factory):
    return loaded(tmp_path_factory, request.param)


def _tokens(vocab: int, n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def _vocab(ref: torch.nn.Module) -> int:
    return int(ref.config.get_text_config().vocab_size)


@pytest.mark.parametrize("name", list(LOGITS_ONLY))
def test_logits_only_variants_match_transformers(tmp_path_factory, name):
    test_logits_match_transformers(loaded(tmp_path_factory, name))


def test_logits_match_transformers(model):
    name, path, ref = model
    toks = _tokens(_vocab(ref), N_POS)
    with torch.no_grad():
        want = ref(torch.tensor([toks])).logits[0].numpy()
    # f16 KV entries alone move logits ~1e-3
    with Engine(path, threads=2, chunk=CHUNK, kv="f32") as e:
        got = e.logits(toks)
        assert e.stats()["chunk"] == CHUNK
    assert got.shape == want.shape == (N_POS, _vocab(ref))
    err = np.abs(got - want).max()
    assert err <= 1e-4 * np.abs(want).max(), (name, err, np.abs(want).max())


def _close(name: str):
    """How far a sequence split off the linear sub-chunks may move the logits (None: not at all)"""
    return LINEAR_CLOSE if name.startswith(("qwen3_next", "qwen3_5_moe")) else None


def test_threads_and_chunk_sizes_bit_identical(model):
    name, path, ref = model
    assert_threads_and_chunks_bit_identical(path, _tokens(_vocab(ref), N_POS, seed=3), CHUNK,
                                            _close(name))


def test_greedy_generation_matches_transformers(model):
    name, path, ref = model
    prompt = _tokens(_vocab(ref), 10, seed=1)
    with Engine(path, threads=2, kv="f32") as e:
        got = list(e.generate(prompt, 32))
    with torch.no_grad():
        ref_logits = ref(torch.tensor([prompt + got[:-1]])).logits[0, len(prompt) - 1:]
    assert_greedy_agrees(got, ref_logits.float().numpy())


def test_kv_cache_continuation_equals_full_eval(model):
    """Feeding a sequence in pieces (KV cache kept) gives the logits of one pass (linear
    attention: within the bound, the cuts are inside its sub-chunks)."""
    name, path, ref = model
    assert_pieces_equal_one_pass(path, _tokens(_vocab(ref), 20, seed=2), cuts=(7, 15),
                                 close=_close(name))


def test_turn_snapshot_continuation_equals_one_pass(model):
    name, path, ref = model
    v = _vocab(ref)
    assert_snapshot_continuation_equals_one_pass(path, _tokens(v, 21, seed=8),
                                                 _tokens(v, 19, seed=9), CHUNK, _close(name))


@pytest.mark.parametrize("model", ["qwen3_5_moe"], indirect=True)
def test_info_says_the_vision_tower_was_skipped(model):
    """Qwen3.5-MoE's converted container says in `info` that its vision tower was left out."""
    from moepack.format.info import container_info
    from typer.testing import CliRunner

    from moepack.cli import app

    _, path, _ = model
    with Container.open(path) as c:
        info = container_info(c)
    assert info["skipped"] == ["vision tower (model.visual.*): text-only conversion, images and "
                               "video are not supported"]
    shown = CliRunner().invoke(app, ["info", str(path)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "not converted" in shown.stdout and "vision tower (model.visual.*)" in shown.stdout


def test_truncate_to_a_prefix(model):
    """Truncating to a prefix and feeding on gives the one-pass logits.  A model with
    linear-attention layers keeps a recurrent state that cannot be rolled back: its plan counts
    that state, and truncation to anything but 0 is refused with the sequence left as it was."""
    name, path, ref = model
    toks = _tokens(_vocab(ref), 20, seed=4)
    with Engine(path, threads=1) as e:
        full = e.logits(toks)
        p = e.plan()
        state = p["state_bytes"]
        e.reset()
        e.feed(toks[:15])
        if name in ("qwen3_next", "qwen3_5_moe"):  # 3 linear layers:
            assert state == 3 * 4 * (56 * 3 + 4 * 8 * 6)  # conv 56 ch x 3 + 4 heads x 8 x 6
            # KV only for the one full-attention layer: k and v, 2 heads x 8 dims, f16 entries
            assert p["kv"] == "f16" and p["kv_token_bytes"] == 2 * 2 * 8 * 2
            assert p["kv_bytes"] - state == p["ctx"] * p["kv_token_bytes"]
            with pytest.raises(EngineError, match="cannot be rolled back"):
                e.truncate(10)
            assert e.position == 15
            e.truncate(0)
            last = e.feed(toks)
        else:
            assert state == 0
            e.truncate(10)
            last = e.feed(toks[10:])
    np.testing.assert_array_equal(last, full[-1])
