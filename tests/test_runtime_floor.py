"""The memory floor is the true minimum: trunk + KV/state + scratch + the expert records held
beyond the cache (one acquire group of top_k records when every record has one size, else as
many again for recycled buffers). A model run at
exactly that floor (no expert cache at all) decodes and processes chunked prompts with the same
logits as a large budget, and the expert memory never exceeds cache capacity + that reserve.
`plan --config` plans a model not converted yet by the same code: equal to the converted one's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from moepack.runtime.engine import BudgetError, Engine, plan, plan_for_config
from resident import peak_growth
from tiny_models import make_checkpoint
from typer.testing import CliRunner

from moepack.cli import app

PROMPT = 40  # chunks of 16, 16, 8 at the floor
DECODE = 6


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("floor")
    # 8 experts, top-2, 3 layers: a 16-token chunk routes to more than top_k experts per layer
    make_checkpoint("mixtral", d / "src", hidden_size=64, intermediate_size=40,
                    num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2,
                    max_position_embeddings=256)
    convert(d / "src", d / "m.moepack", Settings())
    return d / "m.moepack"


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    """Tiny Kimi K3 (KDA state, latent MoE, AttnRes; 5 experts, top-2)."""
    from k3_checkpoint import make_k3_checkpoint
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("floor_k3")
    make_k3_checkpoint(d / "src")
    convert(d / "src", d / "m.moepack", Settings(expert_preset="rvq3-baseline", iters=2))
    return d / "m.moepack"


def _tokens(n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50, n).tolist()


def _run(path, **kw) -> tuple[np.ndarray, list[np.ndarray], dict]:
    """Teacher-forced prompt logits (chunked), then greedy decode step logits, then stats."""
    with Engine(path, ctx=128, **kw) as e:
        prompt = e.logits(_tokens(PROMPT))
        steps, last = [], prompt[-1]
        for _ in range(DECODE):
            last = e.feed([int(np.argmax(last))])
            steps.append(last.copy())
        return prompt, steps, e.stats()


def _strides(path) -> set[int]:
    from moepack.format import Container

    with Container.open(path) as c:
        return {b["stride"] for b in c.banks()}


def test_floor_counts_one_pinned_group_not_every_layers_experts(model):
    p = plan(model, ctx=128)
    assert p["moe_layers"] == 3 and p["top_k"] == 2
    assert _strides(model) == {p["expert_record_bytes"]}  # one size: one group is the reserve
    assert p["pinned_expert_bytes"] == p["top_k"] * p["expert_record_bytes"]
    assert p["floor_bytes"] == (p["trunk_bytes"] + p["kv_bytes"] + p["scratch_bytes"]
                                + p["pinned_expert_bytes"])
    # one token's experts over all layers (what a cold token reads) is no longer in the floor
    assert p["step_expert_bytes"] == 3 * 2 * p["expert_record_bytes"] > p["pinned_expert_bytes"]
    assert p["recommended_bytes"] == p["floor_bytes"] + 4 * p["step_expert_bytes"]
    with pytest.raises(BudgetError, match="below the floor"):
        Engine(model, ctx=128, budget=p["floor_bytes"] - 1)


@pytest.mark.parametrize("extra_records", [0, 1, 3])
def test_exact_floor_gives_large_budget_logits(model, extra_records):
    _check_floor_runs(model, extra_records, layers=3)


def test_k3_at_exact_floor_gives_large_budget_logits(k3):
    """Kimi K3's latent MoE, KDA state and AttnRes bank at the floor: the same logits."""
    _check_floor_runs(k3, 0, layers=plan(k3, ctx=128)["moe_layers"])


def _check_floor_runs(model, extra_records: int, layers: int) -> None:
    """At the floor (no cache) and a few records above it (a cache smaller than one token's
    experts: prefetches evict while groups are pinned): prompt chunks and decode steps equal a
    large budget bit for bit, prefetch on and off, 1 and 2 threads; the cache stays within its
    capacity and all expert buffers within capacity + the floor's pinned reserve."""
    ref_prompt, ref_steps, ref = _run(model, threads=1)
    assert ref["cache_capacity_bytes"] >= plan(model, ctx=128)["experts_bytes"]  # all fit
    for prefetch in (True, False):
        for threads in (1, 2):
            p = plan(model, ctx=128, threads=threads)  # each thread has its task buffer
            budget = p["floor_bytes"] + extra_records * p["expert_record_bytes"]
            # 16-token chunks: the rest of the budget above the floor is all cache
            prompt, steps, s = _run(model, budget=budget, threads=threads, prefetch=prefetch,
                                    chunk=16)
            where = (extra_records, prefetch, threads)
            assert s["chunk"] == 16 and s["floor_bytes"] == p["floor_bytes"], where
            assert s["cache_capacity_experts"] == extra_records, where
            assert np.array_equal(prompt, ref_prompt), where
            for got, want in zip(steps, ref_steps, strict=True):
                assert np.array_equal(got, want), where
            assert s["cache_peak_bytes"] <= s["cache_capacity_bytes"], where
            assert s["expert_peak_bytes"] <= (s["cache_capacity_bytes"]
                                              + p["pinned_expert_bytes"]), where
            assert s["expert_peak_bytes"] >= p["expert_record_bytes"], where  # records were read
            if extra_records == 0:  # no cache: every record used is read when used
                assert s["cache_peak_bytes"] == 0 and s["cache_hits"] == 0, where
                # 3 chunks x layers x top-2 would be all a chunk could pin at once: the
                # chunks routed to more experts than that, in several groups
                assert s["cache_misses"] > (3 + DECODE) * layers * 2, where


def test_plan_of_a_config_equals_the_converted_containers(model):
    """The container convert would write, planned without weights, has the converted
    container's plan (same usable RAM given, so nothing depends on this machine); its size is the
    converted one's less what only the checkpoint has (its file list and tokenizer blobs); the
    memory the engine holds for the index is less by the file list's entries, a few kB."""
    config = json.loads((model.parent / "src" / "config.json").read_text())
    got = plan_for_config(config, ctx=128, ram="3G")
    want = plan(model, ctx=128, ram="3G")
    assert 0.95 * model.stat().st_size < got.pop("container_bytes") <= model.stat().st_size
    index = want["scratch_bytes"] - got["scratch_bytes"]
    assert 0 < index <= 64 << 10
    with_index = ("scratch_bytes", "floor_bytes", "recommended_bytes", "default_bytes")
    assert all(want[k] - got[k] == index for k in with_index), (want, got)
    assert {k: v for k, v in got.items() if k not in with_index} == {
        k: v for k, v in want.items() if k not in with_index}
    assert want["usable_ram_bytes"] == 3 * 10**9
    assert want["default_bytes"] <= want["usable_ram_bytes"]
    assert want["default_cache_bytes"] + want["floor_bytes"] <= want["default_bytes"]


def test_plan_cli_config_and_its_refusals(model, tmp_path):
    runner = CliRunner()
    config = model.parent / "src" / "config.json"
    r = runner.invoke(app, ["plan", "--config", str(config), "--ram", "2G", "--ctx", "64",
                            "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["container_bytes"] <= model.stat().st_size
    assert 0 < plan(model, ctx=64)["floor_bytes"] - p["floor_bytes"] <= 64 << 10  # file list
    r = runner.invoke(app, ["plan", "--config", str(config), "--ram", "2G"])
    assert r.exit_code == 0 and "container (planned)" in r.output and "expert cache" in r.output
    bad = tmp_path / "bad.json"
    for text, why in [("{", "Expecting"), ("[1]", "JSON object"),
                      ('{"architectures": ["NoSuchForCausalLM"]}', "NoSuchForCausalLM")]:
        bad.write_text(text)
        r = runner.invoke(app, ["plan", "--config", str(bad)])
        assert r.exit_code == 1 and why in r.output and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
    for args in ([], [str(model), "--config", str(config)]):
        r = runner.invoke(app, ["plan", *args])
        assert r.exit_code == 2 and "one of them" in r.output


def test_state_snapshot_is_counted_in_the_floor(k3, model):
    """chat and serve keep one recurrent-state snapshot (PrefixReuse): an engine opened with
    snapshots=1 has it in its floor and takes it from the cache, and the snapshot it hands out
    is exactly that size; a model without linear attention has none to count."""
    p0, p1 = plan(k3, ctx=128), plan(k3, ctx=128, snapshots=1)
    assert p0["snapshot_bytes"] == 0 and p1["snapshot_bytes"] == p1["state_bytes"] > 0
    assert p1["floor_bytes"] == p0["floor_bytes"] + p1["state_bytes"]
    assert p1["max_ctx"] <= p0["max_ctx"]
    with pytest.raises(BudgetError, match="below the floor"):
        Engine(k3, ctx=128, budget=p0["floor_bytes"], snapshots=1)
    with Engine(k3, ctx=128, budget=p1["floor_bytes"] + p1["expert_record_bytes"],
                snapshots=1) as e:
        s = e.stats()
        assert s["floor_bytes"] == p1["floor_bytes"] and s["cache_capacity_experts"] == 1
        q = e.plan()  # once: usable RAM moves between two calls on a busy machine
        assert q == {**p1, "usable_ram_bytes": q["usable_ram_bytes"]}
        e.feed(_tokens(5))
        assert len(e.snapshot().state) == p1["snapshot_bytes"]
    with Engine(k3, ctx=128, budget=p0["floor_bytes"] + p1["expert_record_bytes"]) as e:
        assert e.stats()["cache_capacity_experts"] == 1  # without a snapshot: its old floor
    assert plan(model, ctx=128, snapshots=1)["snapshot_bytes"] == 0
    for bad in (-1, 65):
        with pytest.raises(ValueError, match="snapshots"):
            plan(k3, ctx=128, snapshots=bad)


def test_plan_cli_shows_the_snapshot_of_chat_and_serve(k3, model):
    runner = CliRunner()
    r = runner.invoke(app, ["plan", str(k3), "--ctx", "128"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "state snapshot" in ln)
    assert "chat and serve" in line
    r = runner.invoke(app, ["plan", str(model), "--ctx", "128"])
    assert r.exit_code == 0 and "state snapshot" not in r.output, r.output


def test_k3_pinned_reserve_is_one_group(k3):
    """K3's banks share one stride, so its floor reserves one group of top_k records; the exact
    floor runs above hold the expert buffers within capacity + that reserve."""
    p = plan(k3, ctx=128)
    assert _strides(k3) == {p["expert_record_bytes"]}
    assert p["pinned_expert_bytes"] == p["top_k"] * p["expert_record_bytes"]


# shapes where a chunk token's buffers are most of the budget: MLA latents (q LoRA, kv latent,
# per-head queries wider than hidden) and Gated DeltaNet projections wider than hidden
LONG_CHUNK_MODELS = {
    "deepseek_v3": dict(vocab_size=256, hidden_size=256, intermediate_size=384,
                        moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                        num_key_value_heads=8, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                        q_lora_rank=192, kv_lora_rank=128, qk_nope_head_dim=32,
                        qk_rope_head_dim=16, v_head_dim=32, max_position_embeddings=640),
    "qwen3_next": dict(vocab_size=256, hidden_size=256, intermediate_size=384,
                       moe_intermediate_size=128, shared_expert_intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, linear_num_key_heads=2, linear_num_value_heads=8,
                       linear_key_head_dim=32, linear_value_head_dim=48, num_experts=8,
                       num_experts_per_tok=2, mlp_only_layers=[], max_position_embeddings=640),
}


@pytest.mark.parametrize("arch", list(LONG_CHUNK_MODELS))
def test_512_token_chunks_stay_within_the_budget(tmp_path, arch):
    """At exactly the floor plus 496 chunk tokens, a 520-token prompt runs in 512-token chunks
    and a fresh process's anonymous memory grows by no more than the budget, and by at least
    half of it: the plan counts what a chunk token's buffers take, not a multiple (four per-head
    latent query widths a token for MLA left 60 % of this budget unused; now 27 %, Qwen3-Next
    39 %, most of it the transient copies' allowance)."""
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    make_checkpoint(arch, tmp_path / "src", **LONG_CHUNK_MODELS[arch])
    path = tmp_path / "m.moepack"
    convert(tmp_path / "src", path, Settings(expert_preset="rvq3-baseline", iters=2))
    p = plan(path, 600, threads=2, kv="f16")
    budget = p["floor_bytes"] + (512 - 16) * p["chunk_token_bytes"]
    prompt = np.random.default_rng(3).integers(3, 250, 520).tolist()
    m = peak_growth(path, prompt, 4, budget=budget, ctx=600, threads=2, kv="f16", chunk=512)
    assert m["stats"]["chunk"] == 512
    assert 0.5 * budget <= m["peak"] <= budget, (m["peak"], budget)
