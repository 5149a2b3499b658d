"""A prompt longer than the held chunk borrows the expert cache for longer passes (mp_eval,
docs/RUNTIME.md): its logits are the held chunk's bits whatever the budget, cache, thread count,
prefetch and split into calls, on a tiny container of each model module (GQA, MLA, DSA, Gated
DeltaNet, KDA, K3's AttnRes and latent MoE, hyper-connections with k-pool DSA)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from moepack.runtime.engine import Engine, plan
from tiny_containers import tiny_container

ARCHS = ("mixtral", "deepseek_v3", "glm_moe_dsa", "qwen3_next", "kimi_linear", "kimi_k3",
         "glm5_next")
LINEAR_CHUNK = 16  # the engine's default sub-chunk: linear attention's bits hold at its multiples
TRIALS = 12


def _cut(rng: np.random.Generator, n: int, linear: bool) -> int:
    """Where a prompt is split into two calls of two or more tokens each (0: one call); with
    linear attention at a multiple of its sub-chunk"""
    cuts = [c for c in range(2, n - 1) if not linear or c % LINEAR_CHUNK == 0]
    return int(rng.choice([0, *cuts]))


@pytest.mark.parametrize("arch", ARCHS)
def test_borrowed_passes_give_the_held_chunks_bits(tmp_path: Path, arch: str) -> None:
    path = tiny_container(arch, tmp_path)
    rng = np.random.default_rng(sum(map(ord, arch)))
    borrowed = 0
    for _ in range(TRIALS):
        ctx = int(rng.choice([32, 48, 64]))
        threads = int(rng.integers(1, 3))
        prefetch = bool(rng.integers(2))
        p = plan(path, ctx, threads=threads)
        # cache_experts caps the cache below what the budget pays for: the rest is room a long
        # prompt's passes borrow first, the cache's own bytes next
        setup = dict(ctx=ctx, threads=threads, prefetch=prefetch,
                     budget=p["floor_bytes"] + int(rng.integers(4, 40)) * p["expert_record_bytes"],
                     cache_experts=int(rng.choice([0, 1, 2, 3, 5])))
        n = int(rng.integers(ctx // 2, ctx + 1))
        with Engine(path, **setup) as e:
            toks = rng.integers(0, e.vocab_size, n).tolist()
            cut = _cut(rng, n, e.state_bytes > 0)
            whole, s = e.logits(toks), e.stats()
            e.reset()
            split = np.concatenate([e.logits(toks[:cut], reset=False),
                                    e.logits(toks[cut:], reset=False)])
            assert e.stats()["chunk"] == s["chunk"], (setup, e.stats())
        borrowed += s["longest_pass"] > s["chunk"]
        # the held chunk fixed (never borrows), the default budget's cache, the other thread
        # count and prefetch setting
        with Engine(path, ctx=ctx, threads=3 - threads, prefetch=not prefetch,
                    chunk=s["chunk"]) as e:
            want = e.logits(toks)
        what = f"{setup}, {n} tokens cut at {cut}, passes {s['chunk']} -> {s['longest_pass']}"
        np.testing.assert_array_equal(whole, want, err_msg=what)
        np.testing.assert_array_equal(split, want, err_msg=what)
    assert borrowed, f"{arch}: no trial's prompt borrowed the cache"


def test_a_pass_without_memory_to_borrow_runs_in_held_chunks(tmp_path: Path) -> None:
    """When the longer pass's buffers cannot be had (an address-space limit 4 MB above what the
    engine holds, under the 8.4 MB they add), the prompt runs in held chunks: the same bits, and
    the next prompt, with the limit lifted, borrows again."""
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "syn.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=32, hidden=512, inter=1024, vocab=256))
    p = plan(path, 512, threads=2)
    setup = dict(ctx=512, threads=2, cache_experts=0,
                 budget=p["floor_bytes"] + 30 * p["expert_record_bytes"])
    toks = np.random.default_rng(1).integers(0, 256, 500).tolist()
    code = textwrap.dedent(f"""
        import json, re, resource
        from moepack.runtime.engine import Engine
        def vm():
            status = open("/proc/self/status").read()
            return 1024 * int(re.search(r"VmSize:\\s+(\\d+)", status).group(1))
        toks, out = {toks!r}, {{}}
        with Engine({str(path)!r}, **{setup!r}) as e:
            e.feed(toks[:e.stats()["chunk"]])  # every buffer and thread made once
            e.reset()
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (vm() + (4 << 20), hard))
            out["limited"], out["limited_stats"] = e.feed(toks).tolist(), e.stats()
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            e.reset()
            out["free"], out["free_stats"] = e.feed(toks).tolist(), e.stats()
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    held, free = out["limited_stats"], out["free_stats"]
    assert held["longest_pass"] == held["chunk"] < free["longest_pass"], (held, free)
    with Engine(path, **setup, chunk=held["chunk"]) as e:
        want = e.feed(toks)
    np.testing.assert_array_equal(np.array(out["limited"], np.float32), want)
    np.testing.assert_array_equal(np.array(out["free"], np.float32), want)
