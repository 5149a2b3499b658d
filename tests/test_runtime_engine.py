"""Engine behaviour that must not depend on configuration: bit-identical logits across thread
counts, cache sizes and policies, prefetch, O_DIRECT and scalar vs AVX2 kernels; the budget floor;
damaged expert records; stats; resident memory within the budget."""

from __future__ import annotations

import numpy as np
import pytest
from damage import flip
from kernel_paths import (
    KERNELS,
    best_kernels,
    cpu_has_avx2,
    prefill_then_decode,
    runnable_kernels,
)
from moepack.runtime.engine import (
    BudgetError,
    CorruptError,
    Engine,
    EngineError,
    NonFiniteError,
    plan,
)
from resident import peak_growth, resident_after
from tiny_models import make_checkpoint

N_POS = 70


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("mixtral")
    make_checkpoint("mixtral", d / "src", hidden_size=64, intermediate_size=40,
                    num_local_experts=6, num_experts_per_tok=2, max_position_embeddings=512)
    convert(d / "src", d / "m.moepack", Settings())
    return d / "m.moepack"


def _tokens(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 67, n).tolist()


VARIANTS = {
    "threads2": dict(threads=2),
    "no_cache": dict(cache_experts=0),
    "tiny_cache": dict(cache_experts=1),
    "small_cache": dict(cache_experts=3),  # under two top-2 groups: prompt acquires shrink
    "lru": dict(cache_policy="lru"),
    "no_prefetch": dict(prefetch=False),
    "buffered_io": dict(o_direct=False),
    "scalar_kernels": dict(scalar_kernels=True),
    "kernels_scalar": dict(kernels="scalar"),
}


def test_logits_bit_identical_across_configurations(mixtral):
    toks = _tokens(N_POS)
    with Engine(mixtral, threads=1) as e:  # large cache (default budget), prefetch, auto O_DIRECT
        base = prefill_then_decode(e, toks)
        s = e.stats()
    assert s["cache_capacity_experts"] >= 12  # every expert fits: the "large" cache
    for name, kw in VARIANTS.items():
        with Engine(mixtral, **{"threads": 1, **kw}) as e:
            got = prefill_then_decode(e, toks)
        assert np.array_equal(got, base), name


def test_every_kernel_path_bit_identical(mixtral):
    """Each path this CPU runs, forced, gives the auto path's logits bit for bit, in the prompt
    and in decode steps; a path it cannot run is refused at open.  70 tokens in one chunk route
    140 (token, expert) pairs to 6 experts: some expert of every layer gets >= 24 tokens, past
    the 16 from which the AMX path takes its tile layout."""
    toks = _tokens(N_POS, seed=4)
    with Engine(mixtral, threads=2) as e:
        assert e.kernels == best_kernels() and e.stats()["kernels"] == e.kernels
        assert e.stats()["chunk"] >= N_POS
        base = prefill_then_decode(e, toks)
    for name in runnable_kernels():
        for threads in (1, 2):
            with Engine(mixtral, threads=threads, kernels=name) as e:
                assert e.kernels == name
                got = prefill_then_decode(e, toks)
                assert np.array_equal(got, base), (name, threads)
    for name in KERNELS[len(runnable_kernels()):]:
        with pytest.raises(EngineError, match="cannot run"):
            Engine(mixtral, kernels=name)
    with pytest.raises(ValueError):
        Engine(mixtral, kernels="sse9")


def test_kernel_choice_is_per_engine(mixtral):
    """scalar_kernels applies to the engine opened with it only: opening a scalar engine does not
    switch engines already open (or opened later) away from the best path, even while they
    compute."""
    import threading

    if not cpu_has_avx2():
        pytest.skip("CPU without AVX2/FMA/F16C/BMI2: every engine uses the scalar kernels")
    toks = _tokens(40, seed=9)
    best = best_kernels()
    with Engine(mixtral, threads=1) as a:
        assert a.kernels == best
        base = a.logits(toks)
        with Engine(mixtral, threads=1, scalar_kernels=True) as b:
            assert b.kernels == "scalar" and a.kernels == best
            got = {}

            def run(name, eng):
                got[name] = eng.logits(toks)

            ts = [threading.Thread(target=run, args=(n, x)) for n, x in (("a", a), ("b", b))]
            for t in ts:
                t.start()
            with Engine(mixtral, threads=1, scalar_kernels=True) as c:  # opened mid-computation
                assert c.kernels == "scalar"
            for t in ts:
                t.join()
            with Engine(mixtral, threads=1) as d:
                assert d.kernels == best and b.kernels == "scalar"
        assert a.kernels == best
    assert np.array_equal(got["a"], base) and np.array_equal(got["b"], base)


def test_o_direct_on_is_bit_identical_when_the_filesystem_allows_it(mixtral):
    toks = _tokens(N_POS, seed=3)
    with Engine(mixtral, o_direct=False, threads=2) as e:
        base = e.logits(toks)
    try:
        e = Engine(mixtral, o_direct=True, threads=2)
    except EngineError as err:  # tmpfs and some overlay filesystems refuse O_DIRECT
        pytest.skip(f"O_DIRECT unavailable here: {err}")
    with e:
        got = e.logits(toks)
        assert e.stats()["o_direct"] is True
    assert np.array_equal(got, base)


def test_cache_statistics(mixtral):
    toks = _tokens(30, seed=4)
    rec = plan(mixtral)["expert_record_bytes"]
    with Engine(mixtral, cache_experts=0, prefetch=False, threads=1) as e:
        for t in toks:  # one token at a time: every routed expert is one read (2 layers x top-2)
            e.feed([t])
        s = e.stats()
        assert s["cache_hits"] == 0 and s["cache_misses"] == 30 * 2 * 2
        assert s["bytes_read"] == s["cache_misses"] * rec
        e.reset_stats()
        e.logits(toks)  # chunked prompt: each distinct expert once per chunk and layer
        s = e.stats()
        # 2 chunks (16 + 14 tokens) x 2 layers x at most 6 distinct experts
        assert 0 < s["cache_misses"] <= 2 * 2 * 6 and s["bytes_read"] == s["cache_misses"] * rec
    with Engine(mixtral, prefetch=False, threads=1) as e:
        e.logits(toks)
        e.reset_stats()
        e.logits(toks)  # everything is cached now
        s = e.stats()
    assert s["cache_misses"] == 0 and s["cache_hits"] > 0 and s["bytes_read"] == 0
    assert s["prompt_tokens"] == 30 and s["hit_rate"] == 1.0


def test_prompt_prefetch_finds_room_in_a_small_cache(mixtral):
    """A cache holding fewer than two top_k groups: a prompt acquires half the cache at a time,
    so the next group's prefetch has room while this one is pinned and only each layer's first
    acquire in a chunk waits for a read (with whole top_k groups the prefetch found room for one
    record: 4 of 6 experts a layer were read while the compute waited)."""
    toks = _tokens(40, seed=5)
    with Engine(mixtral, cache_experts=3, threads=1) as e:
        e.logits(toks)
        s = e.stats()
    chunks = -(-len(toks) // s["chunk"])
    assert 0 < s["cache_misses"] <= 2 * chunks, s  # 2 layers: one miss each per chunk at most
    assert s["cache_hits"] >= 2 * chunks, s


def test_prompt_in_pieces_equals_one_pass_and_decode_is_close(mixtral):
    """A prompt runs in the plan's chunk (the whole 40-token prompt here), each expert once per
    chunk for all of its tokens (CODECS.md §3.6).  Fed in calls of several tokens it gives the
    one call's logits bit for bit; fed one token per call (decode: §3.5's int8 tables) within
    docs/RUNTIME.md's bound: max |Δlogit| <= 1e-2 of the largest |logit| at every position."""
    toks = _tokens(40, seed=6)
    with Engine(mixtral, threads=2) as e:
        assert e.stats()["chunk"] >= 40
        whole = e.logits(toks)
        e.reset()
        pieces = np.concatenate([e.logits(toks[a:b], reset=False)
                                 for a, b in ((0, 2), (2, 19), (19, 40))])
        e.reset()
        single = np.stack([e.feed([t]) for t in toks])
    assert np.array_equal(pieces, whole)
    err = np.abs(single - whole).max(axis=-1) / np.abs(whole).max()
    assert 0 < err.max() <= 1e-2, err.max()  # two products: they differ, within the bound


@pytest.mark.parametrize("kernels", ["scalar", "auto"])
def test_any_chunk_size_and_thread_count_gives_the_same_bits(mixtral, kernels):
    """docs/RUNTIME.md's guarantee: a prompt's logits are the same bits for every chunk size
    (1 = one token per forward pass of the call, a partial last chunk, the whole prompt) and
    thread count."""
    toks = _tokens(45, seed=9)
    runs = []
    for chunk, threads in [(1, 1), (7, 2), (16, 1), (45, 2), (512, 3)]:
        with Engine(mixtral, threads=threads, chunk=chunk, kernels=kernels, ctx=512) as e:
            assert e.stats()["chunk"] == chunk
            runs.append(e.logits(toks))
    for r in runs[1:]:
        assert np.array_equal(r, runs[0])


def test_planned_chunk_takes_up_to_three_quarters_of_the_room_for_the_longest(mixtral):
    """docs/RUNTIME.md's chunk rule, where the cache cannot hold every expert: half the room above
    the floor goes to the chunk, up to three quarters when that buys the longest chunk (a prompt
    of two passes reads the experts twice); beyond that, half."""
    p = plan(mixtral)
    ctb, every = p["chunk_token_bytes"], p["experts_bytes"]
    ctx = 16 + every // 2 // ctb  # the longest chunk costs about half of all experts
    assert 24 <= ctx < p["max_chunk"], (ctx, p["max_chunk"])
    p = plan(mixtral, ctx=ctx)
    longest = (p["max_chunk"] - 16) * p["chunk_token_bytes"]
    assert p["max_chunk"] == ctx and longest < every
    for share, want in [(0.7, ctx), (0.8, None)]:
        room = int(longest / share)  # below every expert: no room is left once all are cached
        with Engine(mixtral, budget=p["floor_bytes"] + room, ctx=ctx) as e:
            chunk = e.stats()["chunk"]
        half = 16 + room // 2 // p["chunk_token_bytes"]
        assert chunk == (want or half) and (want or chunk < ctx), (share, chunk, half, ctx)


def test_chunk_is_planned_and_checked(mixtral):
    p = plan(mixtral, ctx=256)
    assert p["max_chunk"] == 256 and p["chunk_token_bytes"] > 0
    # exactly the floor: 16-token chunks; a chunk the budget cannot pay for is refused
    with Engine(mixtral, budget=p["floor_bytes"], ctx=256) as e:
        assert e.stats()["chunk"] == 16
    with pytest.raises(BudgetError, match="too small for chunks of 200 tokens"):
        Engine(mixtral, budget=p["floor_bytes"], ctx=256, chunk=200)
    with pytest.raises(ValueError):
        Engine(mixtral, chunk=0.5)


def test_each_compute_thread_has_its_task_buffer_in_the_scratch(mixtral):
    scratch = {t: plan(mixtral, threads=t)["scratch_bytes"] for t in (1, 2, 4)}
    one = scratch[2] - scratch[1]
    assert one > 0 and scratch[4] - scratch[1] == 3 * one
    with Engine(mixtral, threads=4) as e:
        assert e.plan()["scratch_bytes"] == scratch[4]


def test_budget_below_floor_is_refused_with_the_floor(mixtral):
    p = plan(mixtral)
    assert p["floor_bytes"] == (p["trunk_bytes"] + p["kv_bytes"] + p["scratch_bytes"]
                                + p["pinned_expert_bytes"])
    assert p["step_expert_bytes"] == p["moe_layers"] * p["top_k"] * p["expert_record_bytes"]
    assert p["expert_count"] == 2 * 6
    assert p["experts_bytes"] == p["expert_count"] * p["expert_record_bytes"]
    with pytest.raises(BudgetError, match="needs at least") as ei:
        Engine(mixtral, budget=p["floor_bytes"] - 1)
    assert str(p["floor_bytes"]) in str(ei.value)
    with Engine(mixtral, budget=p["floor_bytes"]) as e:  # exactly the floor runs
        assert len(list(e.generate([1, 2, 3], 4))) == 4


def test_damaged_expert_record_is_named_with_verify_reads(mixtral, tmp_path):
    from moepack.format.reader import Container

    bad = tmp_path / "bad.moepack"
    bad.write_bytes(mixtral.read_bytes())
    with Container.open(bad) as c:
        ranges = [c.expert_range(1, e) for e in range(6)]
    for off, _ in ranges:  # one code byte in every expert of layer 1
        flip(bad, off + 5)
    with Engine(bad, verify_reads=True) as e:
        with pytest.raises(CorruptError, match=r"layer 1 expert \d"):
            e.logits([1, 2, 3])
    with Engine(bad) as e:  # without the check the damage goes unnoticed
        e.logits([1, 2, 3])


def test_failed_call_leaves_the_sequence_as_it_was(mixtral, tmp_path):
    """A call whose later chunk fails (a damaged expert record with verify_reads) rolls the
    position back: feed() and logits(reset=False) leave the sequence as before the call, and the
    engine goes on exactly as if the failed call had never been made."""
    from moepack.format.reader import Container

    bad = tmp_path / "bad.moepack"
    with Container.open(mixtral) as c:
        ranges = [c.expert_range(1, x) for x in range(6)]
    rep = [5] * 16  # one repeated token: every position routes alike, so few experts are used
    rest = _tokens(32, seed=11)
    for off, _ in ranges:  # damage one layer-1 expert that the repeated chunk does not use
        bad.write_bytes(mixtral.read_bytes())
        flip(bad, off + 5)
        with Engine(bad, verify_reads=True, cache_experts=0, threads=1) as e:
            try:
                e.feed(rep)
            except CorruptError:
                continue
            e.reset()
            try:
                e.feed(rep + rest)  # first chunk fine, a later one reads the damaged expert
            except CorruptError:
                break
    else:
        pytest.skip("no damaged expert both spared by the first chunk and hit by a later one")
    with Engine(mixtral, threads=1) as ok:
        want = ok.logits(rep + rep[:3])
    with Engine(bad, verify_reads=True, cache_experts=0, threads=1) as e:
        with pytest.raises(CorruptError):
            e.feed(rep + rest)
        assert e.position == 0
        e.feed(rep[:4])
        with pytest.raises(CorruptError):
            e.feed(rep[4:] + rest)
        assert e.position == 4
        with pytest.raises(CorruptError):
            e.logits(rep[4:] + rest, reset=False)
        assert e.position == 4
        got = e.logits(rep[4:] + rep[:3], reset=False)
        assert e.position == 19
        assert np.array_equal(got, want[4:])
        with pytest.raises(CorruptError):
            e.logits(rep + rest)  # reset=True: the reset stays, the sequence is empty
        assert e.position == 0


def test_context_limit_and_bad_tokens(mixtral):
    with Engine(mixtral, ctx=8) as e:
        assert e.ctx == 8
        e.feed(list(range(8)))
        with pytest.raises(EngineError, match="context full"):
            e.feed([1])
        e.reset()
        with pytest.raises(EngineError, match="token ids"):
            e.feed([67])


def test_config_integers_are_checked_not_wrapped(mixtral):
    """What a C int cannot hold, a negative count or a float is refused, never wrapped or
    truncated (2**32 + 64 threads would be 64); the C engine refuses a negative ctx too."""
    for kw in (dict(ctx=2**32 + 64), dict(ctx=-5), dict(threads=-1), dict(threads=1.5),
               dict(io_threads=2**31), dict(cache_experts=-2), dict(chunk=0),
               dict(snapshots=2**32), dict(linear_chunk=-1)):
        with pytest.raises(ValueError, match=next(iter(kw))):
            Engine(mixtral, **kw)
    with pytest.raises(ValueError, match="ctx"):
        plan(mixtral, ctx=-5)
    with Engine(mixtral, threads=0, ctx=0, cache_experts=0) as e:  # 0: the defaults
        assert e.ctx == 512 and e.stats()["cache_capacity_experts"] == 0


def test_float_token_ids_are_refused_not_truncated(mixtral):
    with Engine(mixtral) as e:
        for bad in ([1.7], [1, 2.0], [True], [2**64], [[1, 2]]):
            with pytest.raises(EngineError, match="token ids must be a list of integers"):
                e.feed(bad)
        assert e.position == 0
        e.feed(np.array([1, 2], dtype=np.uint16))
        assert e.position == 2


def test_chunk_longer_than_ctx_is_the_whole_context(mixtral):
    for chunk in (41, 512):
        with Engine(mixtral, ctx=40, chunk=chunk) as e:
            assert e.stats()["chunk"] == 40


def test_cache_capacity_counts_at_most_every_expert(mixtral):
    """A budget paying for more records than int32 counts (or than the model has) is room,
    not records: the byte capacity keeps it, the record count stops at every expert."""
    p = plan(mixtral, ctx=64)
    n = 2**32 + 3  # the budget pays for this many records: no allocation until they are read
    budget = p["floor_bytes"] + n * p["expert_record_bytes"]
    with Engine(mixtral, ctx=64, chunk=16, budget=budget) as e:
        s = e.stats()
    assert s["cache_capacity_bytes"] // p["expert_record_bytes"] == n
    assert s["cache_capacity_experts"] == p["expert_count"]


def test_kv_cache_too_big_to_count_is_refused():
    """A context whose KV bytes would wrap a uint64 (17 GB a token x 2^30 tokens) is refused
    with the bytes per token, not planned as a KV cache of 0 bytes."""
    from moepack.runtime.engine import plan_for_config

    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
           "intermediate_size": 64, "num_hidden_layers": 33, "num_attention_heads": 4096,
           "num_key_value_heads": 4096, "head_dim": 4096, "max_position_embeddings": 2**30,
           "vocab_size": 256, "num_local_experts": 2, "num_experts_per_tok": 1,
           "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False}
    with pytest.raises(BudgetError, match="bytes of KV cache a token"):
        plan_for_config(cfg, ctx=2**30, kv="f32", ram="64T")
    assert plan_for_config(cfg, ctx=1024, kv="f32", ram="64T")["kv_bytes"] == 1024 * 33 * 2**27


def test_sampling_is_seeded(mixtral):
    with Engine(mixtral) as e:
        a = list(e.generate([1, 2], 12, temperature=1.0, top_p=0.9, top_k=20, seed=7))
        b = list(e.generate([1, 2], 12, temperature=1.0, top_p=0.9, top_k=20, seed=7))
        c = list(e.generate([1, 2], 12, temperature=1.0, seed=8))
    assert a == b and len(a) == 12 and a != c


def test_resident_memory_stays_within_the_budget(tmp_path):
    """Synthetic container with ~60 MB of experts; budget = floor + 4 records. Peak growth of a
    fresh process's anonymous memory while opening and generating stays under the budget."""
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "syn.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=32, hidden=512, inter=1024, vocab=256))
    p = plan(path, 64, threads=2)
    budget = p["floor_bytes"] + 4 * p["expert_record_bytes"]
    m = peak_growth(path, [1, 2, 3, 4], 24, budget=budget, ctx=64, threads=2)
    assert m["stats"]["cache_misses"] > 0
    assert m["peak"] <= budget, (m["peak"], budget)


def test_long_prompt_borrows_the_expert_cache_for_longer_passes(tmp_path):
    """A prompt several held chunks long, with a cache of a quarter of the experts: its passes
    take buffers from the cache (fewer passes, each reading what the cache lacks), the logits
    are the bits of the held chunk's passes, the cache gets its budget back, and the process
    stays within the budget."""
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "syn.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=32, hidden=512, inter=1024, vocab=256))
    p = plan(path, 512, threads=2)
    budget = p["floor_bytes"] + 16 * p["expert_record_bytes"]
    toks = _tokens(500, seed=3)
    with Engine(path, ctx=512, budget=budget, threads=2) as e:
        grown, s = e.logits(toks), e.stats()
        full = s["cache_capacity_experts"] * p["expert_record_bytes"]
        assert s["cache_peak_bytes"] < full, s  # the passes took part of the cache
        e.logits(toks[:50])  # fits the held chunk: nothing borrowed, the cache fills again
        assert e.stats()["cache_peak_bytes"] == full, e.stats()
    with Engine(path, ctx=512, budget=budget, threads=2, chunk=s["chunk"]) as e:
        held, h = e.logits(toks), e.stats()
    assert s["chunk"] < s["longest_pass"] < len(toks) and h["longest_pass"] == s["chunk"]
    assert s["bytes_read"] < h["bytes_read"], (s["bytes_read"], h["bytes_read"])
    assert np.array_equal(grown, held)
    m = peak_growth(path, toks, 4, budget=budget, ctx=512, threads=2)
    assert m["stats"]["longest_pass"] > m["stats"]["chunk"]
    assert m["peak"] <= budget, (m["peak"], budget)


def test_borrowed_chunk_buffers_go_back_to_the_system(tmp_path):
    """What a long prompt's passes borrowed leaves the process when its call ends: the cache
    grows back into it, so freed buffers the allocator kept (glibc keeps them in its heap once a
    big free has raised its mmap threshold) would put the process over the budget: the chunk's
    buffers and the compute pool's buffer for the products' input copies. After long
    prompts of several lengths, each followed by a shorter one that refills the cache, the
    process holds what the held chunk's passes leave, and its peak stays within the budget."""
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "syn.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=32, hidden=512, inter=1024, vocab=256))
    p = plan(path, 512, threads=2)
    budget = p["floor_bytes"] + 20 * p["expert_record_bytes"]
    prompts = [_tokens(n, seed=n) for n in (500, 133, 480, 133, 450, 133, 300, 133)]
    lent = resident_after(path, prompts, budget=budget, ctx=512, threads=2)
    s = lent["stats"]
    assert s["longest_pass"] > s["chunk"], s
    held = resident_after(path, prompts, budget=budget, ctx=512, threads=2, chunk=s["chunk"])
    borrowed = (s["longest_pass"] - s["chunk"]) * p["chunk_token_bytes"]
    assert lent["now"] <= held["now"] + borrowed // 4, (lent["now"], held["now"], borrowed)
    assert lent["peak"] <= budget, (lent["peak"], budget)


def test_wide_synthetic_model_is_bit_identical_scalar_vs_simd_and_threads(tmp_path):
    """Rows of hundreds of codes (several column blocks of the blocked AVX2 kernel) and f16
    embeddings: scalar kernels, AVX2 kernels, 1 and 2 threads all give the same bits."""
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "wide.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=4, hidden=512, inter=384, vocab=96))
    toks = _tokens(12, seed=5)
    runs = []
    for kw in (dict(threads=1), dict(threads=2), dict(threads=1, scalar_kernels=True),
               dict(threads=2, scalar_kernels=True, cache_experts=0)):
        with Engine(path, ctx=16, **kw) as e:
            runs.append(e.logits(toks))
    assert np.isfinite(runs[0]).all() and np.abs(runs[0]).max() > 0
    for r in runs[1:]:
        assert np.array_equal(r, runs[0])


def test_q6_trunk_is_bit_identical_scalar_vs_simd_and_threads(tmp_path):
    """q6 attention (group 32) and q6 embedding / LM head (group 16: a row gather and a matvec)
    over 260 columns: full 8-column blocks, a 4-column tail and padding in each row's last group."""
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "q6.moepack"
    write_synthetic(path, mixtral_spec(layers=1, experts=4, hidden=260, inter=96, vocab=96,
                                       heads=2, kv_heads=1, attn={"name": "q6", "group_size": 32},
                                       embed={"name": "q6", "group_size": 16}))
    toks = _tokens(12, seed=6)
    runs = []
    for kw in (dict(threads=1), dict(threads=2), dict(threads=1, scalar_kernels=True),
               dict(threads=2, scalar_kernels=True)):
        with Engine(path, ctx=16, **kw) as e:
            runs.append(e.logits(toks))
    assert np.isfinite(runs[0]).all() and np.abs(runs[0]).max() > 0
    for r in runs[1:]:
        assert np.array_equal(r, runs[0])


def test_f16_codebooks_give_the_logits_of_f32_codebooks_holding_the_same_values(tmp_path,
                                                                                monkeypatch):
    """An f16 codebook is widened to f32 at load (CODECS.md §3): logits are bit-identical to an
    f32-codebook container with the same (f16-representable) entries, scalar and SIMD."""
    from moepack.format import synthetic
    from moepack.format.reader import Container
    from moepack.format.synthetic import F16, F32, mixtral_spec, write_synthetic

    plain = synthetic.encode_synthetic

    def widened(codec, shape, seed):  # codebooks ([S, 256, 8]): the f16 entries, stored as f32
        if len(shape) == 3:
            return np.frombuffer(plain(F16, shape, seed), "<f2").astype("<f4").tobytes()
        return plain(codec, shape, seed)

    half, full = tmp_path / "f16.moepack", tmp_path / "f32.moepack"
    kw = dict(layers=2, experts=4, hidden=64, inter=32, vocab=96)
    write_synthetic(half, mixtral_spec(**kw, codebook=F16))
    with monkeypatch.context() as m:
        m.setattr(synthetic, "encode_synthetic", widened)
        write_synthetic(full, mixtral_spec(**kw, codebook=F32))
    cb = "layers.1.experts.down.codebook"
    with Container.open(half) as a, Container.open(full) as b:
        assert 2 * a.tensor_info(cb)["length"] == b.tensor_info(cb)["length"]
        assert np.array_equal(a.tensor(cb), b.tensor(cb))
        assert np.array_equal(a.expert_part(1, 2, "down"), b.expert_part(1, 2, "down"))
    toks = _tokens(12, seed=7)
    for kw in (dict(threads=1), dict(threads=2, scalar_kernels=True)):
        with Engine(half, ctx=16, **kw) as e:
            got = e.logits(toks)
        with Engine(full, ctx=16, **kw) as e:
            want = e.logits(toks)
        assert np.isfinite(got).all() and np.abs(got).max() > 0
        assert np.array_equal(got, want)


def test_nan_router_weights_do_not_crash(tmp_path):
    """Damaged trunk bytes (NaN router: every score compares false) still route to valid experts;
    the NaN propagates to the logits, which the engine refuses to return (MP_ENONFINITE)."""
    from moepack.format.reader import Container
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "nan.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=4, hidden=64, inter=32, vocab=40))
    with Container.open(path) as c:
        info = c.tensor_info("layers.0.router")
        off, n = info["offset"], info["length"]
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(np.full(n // 4, np.nan, dtype="<f4").tobytes())
    with Engine(path, ctx=8) as e:
        with pytest.raises(NonFiniteError, match="non-finite logit .* at position 0"):
            e.logits([1, 2, 3])
        assert e.position == 0


def test_warm_up_reads_every_expert_once_when_the_cache_holds_all(mixtral):
    """With the cache holding every expert, open starts reading them all in the background: the
    reads total every record once, later calls only hit, and the logits are those of an engine
    that reads on demand. With room for one expert fewer nothing is read ahead."""
    import time

    from moepack.format.reader import Container

    with Container.open(mixtral) as c:
        banks = c.banks()
    n = sum(b["count"] for b in banks)
    every = sum(b["count"] * b["stride"] for b in banks)
    toks = _tokens(12, seed=5)
    with Engine(str(mixtral), threads=1, warm=False) as cold:
        want = cold.logits(toks)
        assert cold.stats()["warm_reads"] == 0
    with Engine(str(mixtral), threads=1) as e:
        deadline = time.monotonic() + 60
        while e.stats()["warming"] and time.monotonic() < deadline:
            time.sleep(0.02)
        s = e.stats()
        assert not s["warming"] and s["warm_reads"] == n and s["bytes_read"] == every, s
        got = e.logits(toks)
        s = e.stats()
        assert s["cache_misses"] == 0 and s["cache_hits"] > 0 and s["bytes_read"] == every, s
    np.testing.assert_array_equal(got, want)
    with Engine(str(mixtral), threads=1, cache_experts=n - 1) as e:
        e.logits(toks[:2])
        assert e.stats()["warm_reads"] == 0
