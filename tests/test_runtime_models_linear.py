"""Linear-attention hybrids in the C engine against transformers (KDA: Kimi-Linear).

As tests/test_runtime_models.py: a tiny random checkpoint converted by the real converter,
exported, loaded by transformers (PyTorch fallback kernels: its chunked KDA for prompts, 64
tokens a chunk) with the routed experts patched to the engine's products (tests/spec_experts.py);
tolerance max |Δlogit| <= 1e-4 x max |logit| over 80 positions.  The engine runs the prompt in
chunks of 16 tokens, so both sides cross their chunk boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_invariants import (
    LINEAR_CHUNK,
    LINEAR_CLOSE,
    assert_failed_call_changes_nothing,
    assert_greedy_agrees,
    assert_pieces_equal_one_pass,
    assert_threads_and_chunks_bit_identical,
)
from kernel_paths import runnable_kernels
from moepack.runtime.engine import Engine, EngineError
from spec_experts import use_spec_expert_numerics
from tiny_models import make_checkpoint, model_class

N_POS = 80
CHUNK = 16
# Kimi-Linear (tests/tiny_models.py): 3 KDA layers of 3 heads x 6 dims, conv kernel 4; one MLA
# layer with kv_lora 8 + rope part 4
KDA_LAYERS, KDA_QD, KDA_HEADS, KDA_DIM, CONV = 3, 18, 3, 6, 4
LATENT = 8 + 4
# comparisons with transformers use an f32 KV cache (f16 entries round the cached latent)
EXACT_KV = {"kv": "f32"}


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("kimi_linear")
    make_checkpoint("kimi_linear", d / "src", max_position_embeddings=128)
    convert(d / "src", d / "m.moepack", Settings())
    export(d / "m.moepack", d / "hf")
    ref = model_class("kimi_linear").from_pretrained(d / "hf", dtype=torch.float32).eval()
    use_spec_expert_numerics(ref, d / "m.moepack")
    return d / "m.moepack", ref


def _tokens(vocab: int, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def _vocab(ref: torch.nn.Module) -> int:
    return int(ref.config.vocab_size)


def test_description_has_kda_and_unrotated_mla(kimi):
    from moepack.format.reader import Container

    path, _ = kimi
    with Container.open(path) as c:
        m = c.manifest["model"]
    assert m["layer_attention"] == ["linear", "full", "linear", "linear"]
    assert m["linear_attention"] == {"kind": "kda", "num_heads": 3, "head_dim": 6,
                                     "conv_kernel_size": 4}
    assert m["attention"]["rope"] is False and m["attention"]["q_lora_rank"] is None
    assert m["layer_kinds"] == ["dense", "moe", "moe", "moe"]


def test_logits_match_transformers(kimi):
    path, ref = kimi
    toks = _tokens(_vocab(ref), N_POS, seed=0)
    with torch.no_grad():
        want = ref(torch.tensor([toks])).logits[0].numpy()
    with Engine(path, threads=2, chunk=CHUNK, **EXACT_KV) as e:
        got = e.logits(toks)
    assert got.shape == want.shape == (N_POS, _vocab(ref))
    err = np.abs(got - want).max()
    assert err <= 1e-4 * np.abs(want).max(), (err, np.abs(want).max())


def test_greedy_generation_matches_transformers(kimi):
    path, ref = kimi
    prompt = _tokens(_vocab(ref), 10, seed=1)
    with Engine(path, threads=2, **EXACT_KV) as e:
        got = list(e.generate(prompt, 32))
    with torch.no_grad():
        ref_logits = ref(torch.tensor([prompt + got[:-1]])).logits[0, len(prompt) - 1:]
    assert_greedy_agrees(got, ref_logits.float().numpy())


def test_threads_and_chunk_sizes_bit_identical(kimi):
    path, ref = kimi
    assert_threads_and_chunks_bit_identical(path, _tokens(_vocab(ref), N_POS, seed=3), CHUNK,
                                            LINEAR_CLOSE)


@pytest.mark.parametrize("cuts", [(7, 30), (LINEAR_CHUNK, 2 * LINEAR_CHUNK)],
                         ids=["inside-sub-chunks", "at-sub-chunks"])
def test_continuation_equals_one_pass(kimi, cuts):
    """Cut inside a sub-chunk: within the bound; at multiples of it: the same bits."""
    path, ref = kimi
    assert_pieces_equal_one_pass(path, _tokens(_vocab(ref), 40, seed=2), cuts=cuts, chunk=CHUNK,
                                 close=LINEAR_CLOSE)


def test_delta_rule_forms_and_kernel_paths(kimi):
    """linear_chunk 1 is the token form whatever the pass (chunk 1's bits at chunk 16); the
    chunk form gives the same bits on every kernel path this CPU runs (the delta rule's portable
    build on the scalar table, its AVX2 build on the others); an out-of-range sub-chunk is
    refused in one line."""
    path, ref = kimi
    toks = _tokens(_vocab(ref), 40, seed=14)
    runs = {}
    for name, kw in {"token": dict(chunk=1), "token-form": dict(chunk=CHUNK, linear_chunk=1),
                     "auto": dict(chunk=CHUNK),
                     **{k: dict(chunk=CHUNK, kernels=k) for k in runnable_kernels()}}.items():
        with Engine(path, threads=2, **kw) as e:
            runs[name] = e.logits(toks)
    np.testing.assert_array_equal(runs["token-form"], runs["token"])
    for k in runnable_kernels():
        np.testing.assert_array_equal(runs[k], runs["auto"], err_msg=k)
    LINEAR_CLOSE(runs["auto"], runs["token"], "chunk form vs token form")
    with pytest.raises(EngineError, match=r"^linear_chunk 65: must be 0\.\.64 "):
        Engine(path, linear_chunk=65)


def test_planned_chunk_is_a_multiple_of_the_sub_chunk(kimi):
    """ctx 100 allows chunks of 100: the planner takes 96, so that no sub-chunk of a long
    prompt straddles two passes (which would send it through the token form)."""
    path, _ = kimi
    with Engine(path, ctx=100) as e:
        assert e.stats()["chunk"] == 6 * LINEAR_CHUNK
    with Engine(path, ctx=100, linear_chunk=1) as e:
        assert e.stats()["chunk"] == 100


def test_engine_plan_is_its_own_with_any_sub_chunk(kimi):
    """Engine.plan() plans with the engine's linear_chunk (its scratch depends on it)."""
    path, _ = kimi
    floors = set()
    for sub in (1, 64):
        with Engine(path, ctx=100, linear_chunk=sub) as e:
            assert e.plan()["floor_bytes"] == e.stats()["floor_bytes"], sub
            floors.add(e.stats()["floor_bytes"])
    assert len(floors) == 2  # else the check above could not tell the plans apart


def test_plan_counts_state_and_one_latent_cache(kimi):
    path, ref = kimi
    with Engine(path, threads=1) as e:
        p = e.plan()
        conv = 3 * KDA_QD * (CONV - 1)
        rec = KDA_HEADS * KDA_DIM * KDA_DIM
        assert p["state_bytes"] == KDA_LAYERS * 4 * (conv + rec)
        # the MLA layer alone has a cache: latent + rope part per position, f32 or f16 entries
        per_token = (p["kv_bytes"] - p["state_bytes"]) / p["ctx"]
        assert per_token in (LATENT * 4, LATENT * 2), per_token
        e.feed(_tokens(_vocab(ref), 12, seed=5))
        with pytest.raises(EngineError, match="cannot be rolled back"):
            e.truncate(5)
        assert e.position == 12


# KDA description fields: (change under manifest.model, field both validators name)
KDA_CONFIG = {"architectures": ["KimiLinearForCausalLM"], "vocab_size": 64, "hidden_size": 16,
              "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16,
              "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_token": 2,
              "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
              "model_max_length": 64, "linear_attn_config": {
                  "num_heads": 2, "head_dim": 4, "short_conv_kernel_size": 4,
                  "full_attn_layers": [2], "kda_layers": [1]}}
KDA_TABLE: list[tuple[dict, str]] = [
    ({"linear_attention.kind": "kda2"}, "linear_attention.kind"),
    ({"linear_attention.num_heads": 0}, "linear_attention.num_heads"),
    ({"linear_attention.num_heads": 4097}, "linear_attention.num_heads"),
    ({"linear_attention.head_dim": 0}, "linear_attention.head_dim"),
    ({"linear_attention.head_dim": "6"}, "linear_attention.head_dim"),
    ({"linear_attention.conv_kernel_size": 65}, "linear_attention.conv_kernel_size"),
    ({"attention.rope": "no"}, "attention.rope"),
    ({"attention.latent_norm_eps": 0}, "attention.latent_norm_eps"),
    ({"attention.latent_norm_eps": 2.0}, "attention.latent_norm_eps"),
]


@pytest.mark.parametrize("change,field", KDA_TABLE, ids=[f"{f}-{c}" for c, f in KDA_TABLE])
def test_kda_fields_refused_by_both(tmp_path, change: dict, field: str) -> None:
    from model_refusals import assert_refused_by_both
    from moepack.convert.plan import described

    adapter = described(KDA_CONFIG)
    assert_refused_by_both(tmp_path, adapter.model, adapter.config, change, field)


def test_kda_base_description_passes_both(tmp_path) -> None:
    from model_refusals import reseal_model
    from moepack.convert.plan import described
    from moepack.runtime.engine import plan

    adapter = described(KDA_CONFIG)
    assert adapter.model["layer_attention"] == ["linear", "full"]
    try:  # C parses manifest.model; the base container's tensors are another model's
        plan(str(reseal_model(tmp_path, adapter.model, adapter.config)))
    except EngineError as e:
        assert "manifest.model" not in str(e), e


def test_failed_call_leaves_the_recurrent_state_as_it_was(kimi, tmp_path):
    """A call that fails after the KDA layers have run (an expert record of the last MoE layer
    damaged) leaves position and state as they were (tests/engine_invariants.py)."""
    path, ref = kimi
    assert_failed_call_changes_nothing(path, tmp_path, 3, _tokens(_vocab(ref), 3, seed=6),
                                       _tokens(_vocab(ref), 40, seed=7), CHUNK)


def test_chat_continuation_from_a_turn_snapshot_equals_one_pass(kimi):
    """Turn 1's prompt, a snapshot, a reply; back to the snapshot and on with another reply (as
    chat does when the template re-renders the reply differently): the logits of one pass, within
    the bound (turn 1 ends inside a sub-chunk)."""
    path, ref = kimi
    turn1, turn2 = _tokens(_vocab(ref), 21, seed=8), _tokens(_vocab(ref), 19, seed=9)
    with Engine(path, threads=1, chunk=CHUNK) as e:
        full = e.logits(turn1 + turn2)
        e.reset()
        e.feed(turn1)
        snap = e.snapshot()
        assert len(snap.state) == e.plan()["state_bytes"] > 0
        list(e.generate([7], 5, reset=False))
        e.restore(snap)
        assert e.position == len(turn1)
        LINEAR_CLOSE(e.logits(turn2, reset=False), full[len(turn1):], "turn 2")
        e.reset()
        e.feed(turn2)
        with pytest.raises(EngineError, match="does not match"):
            e.restore(snap)  # another sequence: its KV rows are not turn 1's
        from moepack.runtime.engine import Snapshot

        with pytest.raises(EngineError, match="cannot be restored"):
            e.restore(Snapshot((), snap.state[:-4]))  # a cut-off state (or another model's)
        assert e.position == len(turn2)


def test_prefix_reuse_restores_the_turn_boundary(kimi):
    """PrefixReuse (chat, serve): a new prompt that shares the last prompt but not the reply as
    generated goes back to the turn snapshot and feeds only the rest; one that extends the whole
    sequence feeds only its new tokens; the logits are the one-pass logits (within the bound: the
    turns end inside sub-chunks) either way."""
    from moepack.runtime.prefix import PrefixReuse

    path, ref = kimi
    v = _vocab(ref)
    p1, user = _tokens(v, 20, seed=10), _tokens(v, 6, seed=11)
    with Engine(path, threads=1, chunk=CHUNK) as e:
        reuse = PrefixReuse(e)
        assert reuse.rewind(p1) == 0
        e.feed(p1)
        reuse.mark()
        reply = [5, 9, 13]  # fed as a reply would be
        e.feed(reply)
        # the reply re-rendered differently: back to the end of p1
        p2 = p1 + [reply[0], 3] + user
        n = reuse.rewind(p2)
        assert n == len(p1) and e.position == len(p1)
        got2 = e.logits(p2[n:], reset=False)
        # a prompt that extends everything fed: nothing dropped
        p3 = p2 + user
        assert reuse.rewind(p3) == len(p2)
        got3 = e.logits(p3[len(p2):], reset=False)
        full = e.logits(p3)
    LINEAR_CLOSE(got2, full[n:len(p2)], "from the turn snapshot")
    LINEAR_CLOSE(got3, full[len(p2):], "extending the sequence")


@pytest.mark.parametrize("keeps_reply", [True, False], ids=["reply-kept", "reply-dropped"])
def test_chat_second_turn_equals_one_pass(kimi, monkeypatch, keeps_reply):
    """`moepack chat` on a linear-attention model: turn 2 feeds only what turn 1 did not (when
    the template drops the reply, as reasoning templates do, from turn 1's snapshot) and its
    reply is what greedy generation over the whole rendered conversation gives."""
    from moepack.runtime import cli_chat
    from moepack.runtime.tokenizer import Tokenizer
    from typer.testing import CliRunner

    from moepack.cli import app

    path, _ = kimi
    tok = Tokenizer.from_container(str(path))

    def render(msgs):
        return [m for m in msgs if keeps_reply or m["role"] != "assistant"]

    real_encode, fed = cli_chat._encode_chat, []
    monkeypatch.setattr(cli_chat, "_encode_chat", lambda t, msgs: real_encode(t, render(msgs)))
    real_feed = Engine.feed
    monkeypatch.setattr(Engine, "feed", lambda self, t: fed.append(len(t)) or real_feed(self, t))
    r = CliRunner().invoke(app, ["chat", str(path), "-n", "6", "--kv", "f32"],
                           input="w5 w6 w7\nw8 w9\n\n")
    assert r.exit_code == 0, r.output
    replies = [line.strip() for line in r.stdout.splitlines()]  # stdin no terminal: no "> "
    assert len(replies) >= 2, r.output
    msgs = render([{"role": "user", "content": "w5 w6 w7"},
                   {"role": "assistant", "content": replies[0]},
                   {"role": "user", "content": "w8 w9"}])
    ids = tok.encode_chat(msgs)
    prompts = [n for n in fed if n > 1]
    assert prompts[0] == 3 and len(prompts) == 2 and prompts[1] <= len(ids) - 3
    with Engine(path, threads=1, kv="f32") as e:
        want = list(e.generate(ids, 6, stop=[tok.eos_id]))
    assert replies[1] == tok.decode([t for t in want if t != tok.eos_id]).strip()


def test_serve_reuses_the_prompt_of_the_last_request(kimi):
    """serve's Generator on a linear-attention model: a request that shares the previous prompt
    but not its reply starts from the snapshot at that prompt's end (cached_tokens) and samples
    what a fresh engine samples for the whole prompt."""
    from moepack.runtime.tokenizer import Tokenizer
    from moepack.serve.generate import Generator
    from moepack.serve.job import Job
    from moepack.serve.vocab import Vocab

    path, ref = kimi
    v = _vocab(ref)
    p1, p2 = _tokens(v, 24, seed=12), _tokens(v, 9, seed=13)
    vocab = Vocab(Tokenizer.from_container(str(path)), v)
    with Engine(path, threads=1, chunk=CHUNK) as e, Engine(path, threads=1, chunk=CHUNK) as fresh:
        gen = Generator(e, vocab)
        first = gen.run(Job(prompt=p1, max_tokens=4, temperature=0.0))
        assert first.cached_tokens == 0
        again = gen.run(Job(prompt=p1 + p2, max_tokens=6, temperature=0.0))
        want = Generator(fresh, vocab).run(Job(prompt=p1 + p2, max_tokens=6, temperature=0.0))
    assert again.cached_tokens == len(p1) and want.cached_tokens == 0
    assert again.text == want.text and again.completion_tokens == want.completion_tokens
