"""The KV cache: f16 or f32 entries (`kv=`), attention over long contexts split into fixed tasks
(same bits for any thread count and chunking), the plan's KV bytes per token and longest context,
and the refusals for a context beyond the model or the budget."""

from __future__ import annotations

import ctypes as C
import json
import subprocess
import sys

import numpy as np
import pytest
from kernel_paths import prefill_then_decode, runnable_kernels
from moepack.runtime import _lib
from moepack.runtime.engine import BudgetError, Engine, EngineError, plan
from tiny_models import make_checkpoint

MAX_POS = 512


def _convert(tmp_path_factory, arch: str, **cfg) -> str:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp(arch)
    make_checkpoint(arch, d / "src", max_position_embeddings=MAX_POS, **cfg)
    convert(d / "src", d / "m.moepack", Settings())
    return str(d / "m.moepack")


@pytest.fixture(scope="module")
def gqa(tmp_path_factory) -> str:
    # 8 query heads over 2 KV heads (the scores tasks read a key row once per KV group) of 80
    # dims (two value slices, the second partial)
    return _convert(tmp_path_factory, "mixtral", hidden_size=64, intermediate_size=40,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=80,
                    num_local_experts=4, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def mla(tmp_path_factory) -> str:
    # 20 heads: two head groups of the scores tasks, the second partial; a latent of 72 (two
    # value slices)
    return _convert(tmp_path_factory, "deepseek_v3", num_attention_heads=20,
                    num_key_value_heads=20, kv_lora_rank=72)


def _tokens(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 60, n).tolist()


def test_f16_rounding_is_numpys():
    """The cache's f32 -> f16 conversion (kernels.c mpk_f32_to_f16) rounds to nearest even like
    numpy: ties, subnormals, the overflow edge at 65520, signed zeros, Inf and NaN."""
    fn = _lib.load().mp_f32_to_f16
    fn.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t]
    fn.restype = None
    rng = np.random.default_rng(1)
    edges = np.array([0.0, -0.0, 1.0, 1 + 2**-11, 1 + 3 * 2**-11, 65504, 65519.9, 65520, -65520,
                      2**-24, 2**-25, 3 * 2**-26, 2**-25 * 1.0001, 2**-14 - 2**-25, 6e-8, 1e-10,
                      np.inf, -np.inf, np.nan, 1e38], dtype=np.float32)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([edges, rng.standard_normal(50_000).astype(np.float32) * 3, bits])
    got = np.empty(x.size, dtype=np.uint16)
    fn(x.ctypes.data, got.ctypes.data, x.size)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(got[~nan], want.view(np.uint16)[~nan])
    assert np.all((got[nan] & 0x7C00) == 0x7C00) and np.all(got[nan] & 0x3FF)  # stays a NaN


@pytest.mark.parametrize("fixture", ["gqa", "mla"])
def test_f16_halves_the_kv_bytes_per_token(request, fixture):
    path = request.getfixturevalue(fixture)
    p32, p16 = plan(path, ctx=256, kv="f32"), plan(path, ctx=256, kv="f16")
    assert (p32["kv"], p16["kv"]) == ("f32", "f16")
    assert p32["kv_token_bytes"] == 2 * p16["kv_token_bytes"] > 0
    assert p32["kv_bytes"] - p32["state_bytes"] == 256 * p32["kv_token_bytes"]
    assert p16["kv_bytes"] - p16["state_bytes"] == 256 * p16["kv_token_bytes"]
    # the floor saves the KV half (f16 keys are converted as the score products read them: no
    # f32 copies in the scratch)
    assert p16["scratch_bytes"] == p32["scratch_bytes"]
    assert p32["floor_bytes"] - p16["floor_bytes"] == 256 * p16["kv_token_bytes"]
    assert plan(path, ctx=256)["kv"] == "f16"  # the default
    with pytest.raises(ValueError, match="kv must be"):
        plan(path, kv="f8")


@pytest.mark.parametrize("fixture", ["gqa", "mla"])
def test_f16_kv_is_close_to_f32_and_not_the_same(request, fixture):
    path = request.getfixturevalue(fixture)
    toks = _tokens(64, seed=2)
    with Engine(path, threads=2, kv="f32") as e32, Engine(path, threads=2) as e16:
        assert (e32.kv, e16.kv, e16.stats()["kv"]) == ("f32", "f16", "f16")  # f16: the default
        a, b = e32.logits(toks), e16.logits(toks)
    assert not np.array_equal(a, b)  # the cache really holds f16
    assert np.abs(a - b).max() <= 1e-2 * np.abs(a).max()


@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("fixture", ["gqa", "mla"])
def test_long_context_same_bits_for_any_threads_and_chunking(request, fixture, kv):
    """300 positions and 8 decode steps after them: several position blocks per head group and
    enough work for the pool; threads 1/2/3, chunks of 1/7/64/300 and every kernel path this
    CPU runs give the same bits."""
    path = request.getfixturevalue(fixture)
    toks = _tokens(300, seed=3)
    runs = []
    paths = [(2, 64, name) for name in runnable_kernels()[1:-1]]  # between scalar and auto
    for threads, chunk, kernels in [(1, 300, "auto"), (2, 7, "auto"), (3, 64, "scalar"),
                                    (2, 1, "scalar"), *paths]:
        with Engine(path, threads=threads, chunk=chunk, kv=kv, kernels=kernels, ctx=MAX_POS) as e:
            runs.append(prefill_then_decode(e, toks))
    assert np.isfinite(runs[0]).all()
    for r in runs[1:]:
        assert np.array_equal(r, runs[0])


def test_continuation_after_a_long_prompt_equals_one_pass(gqa):
    toks = _tokens(290, seed=4)
    with Engine(gqa, threads=2) as e:
        whole = e.logits(toks)[-1]
        e.reset()
        e.feed(toks[:250])
        last = e.feed(toks[250:])
    assert np.array_equal(whole, last)


def test_context_up_to_the_model_maximum_and_not_beyond(gqa):
    with Engine(gqa, ctx=MAX_POS, threads=1) as e:
        assert e.ctx == MAX_POS
        e.feed(_tokens(MAX_POS))
        with pytest.raises(EngineError, match="context full"):
            e.feed([1])
    with pytest.raises(EngineError, match=f"longest context, {MAX_POS} tokens"):
        Engine(gqa, ctx=MAX_POS + 1)
    with pytest.raises(EngineError, match=f"longest context, {MAX_POS} tokens"):
        plan(gqa, ctx=MAX_POS + 1)


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_budget_refusal_names_the_longest_context_that_fits(gqa, kv):
    """A budget that pays the floor for 300 positions: ctx 512 is refused with the longest
    context that fits, which opens; one more does not."""
    budget = plan(gqa, ctx=300, kv=kv)["floor_bytes"]
    fit = plan(gqa, ctx=MAX_POS, kv=kv, budget=budget)["max_ctx"]
    assert fit == 300  # the floor grows by the same bytes per token of context
    with pytest.raises(BudgetError, match=f"longest context that fits is {fit} tokens"):
        Engine(gqa, ctx=MAX_POS, kv=kv, budget=budget)
    with Engine(gqa, ctx=fit, kv=kv, budget=budget, chunk=16) as e:
        assert e.ctx == fit
    with pytest.raises(BudgetError):
        Engine(gqa, ctx=fit + 1, kv=kv, budget=budget, chunk=16)
    assert plan(gqa, kv=kv, budget=budget // 1000)["max_ctx"] == 0


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moepack", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_cli_kv_flag_and_plan_rows(gqa):
    r = _cli("plan", gqa, "--ctx", 64, "--kv", "f32")
    assert r.returncode == 0, r.stderr
    assert "(f32 entries)" in r.stdout and "longest context" in r.stdout
    p16 = plan(gqa, ctx=64, kv="f16")
    r = _cli("plan", gqa, "--ctx", 64, "--budget", p16["floor_bytes"] - 1)
    assert r.returncode == 1 and "the longest context that fits is 63 tokens" in r.stderr
    r = _cli("run", gqa, "--tokens", "1,2,3", "-n", 2, "--kv", "f32", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["kv"] == "f32"
    r = _cli("run", gqa, "--tokens", "1,2,3", "--kv", "bf16")
    assert r.returncode == 2 and "--kv" in r.stderr
    r = _cli("run", gqa, "--tokens", "1,2,3", "--ctx", MAX_POS + 1)
    assert r.returncode == 1 and f"longest context, {MAX_POS} tokens" in r.stderr


def test_serve_passes_kv_to_the_engine(gqa):
    """A budget that pays the f16 floor but not the f32 one: `serve --kv f32` is refused at open
    (with the f16 default it would start serving)."""
    budget = plan(gqa, ctx=64, kv="f16")["floor_bytes"]
    assert budget < plan(gqa, ctx=64, kv="f32")["floor_bytes"]
    from serve_fixtures import free_port

    r = _cli("serve", gqa, "--ctx", 64, "--budget", budget, "--kv", "f32",
             "--port", free_port())
    assert r.returncode == 1 and "below the floor" in r.stderr, r.stderr
    r = _cli("serve", gqa, "--kv", "f8")
    assert r.returncode == 2 and "--kv" in r.stderr
