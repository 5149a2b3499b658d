"""Fast tests of the benchmark helpers (bench/): cgroup parsing, generator shape math, sweep
points, the BENCHMARKS.md renderer. No big files, no llama.cpp."""

from __future__ import annotations

import json
import os
import signal

import pytest

from bench import cgroup
from bench.cache_sweep import sweep_points
from bench.synthetic_model import Shape, shape_for_size, write_moepack


def test_parse_limit() -> None:
    assert cgroup.parse_limit("max\n") is None
    assert cgroup.parse_limit("9223372036854771712\n") is None  # v1 "unlimited"
    assert cgroup.parse_limit("1073741824\n") == 1 << 30
    assert cgroup.parse_limit("") is None


def test_parse_kv_memory_stat_and_proc_io() -> None:
    stat = cgroup.parse_kv("cache 4096\nrss 8192\nbogus line here\npgmajfault 3\n")
    assert stat == {"cache": 4096, "rss": 8192, "pgmajfault": 3}
    io = cgroup.parse_kv("rchar: 10\nwchar: 0\nread_bytes: 4096\n")
    assert io["read_bytes"] == 4096 and io["rchar"] == 10
    assert "read_bytes" in cgroup.io_counters()


def test_measurement_json_out_takes_last_json_line() -> None:
    m = cgroup.Measurement(cmd=[], limit_bytes=None, rc=0, wall_s=0, peak_cgroup_bytes=None,
                           max_rss_bytes=0, read_bytes=0, major_faults=0, failcnt=None,
                           stdout='noise\n{"a": 1}\n{"b": 2}\ntrailing\n', stderr_tail="",
                           cgroup_version=None)
    assert m.json_out() == {"b": 2}
    m.stdout = "{broken\n"
    assert m.json_out() is None


@pytest.mark.skipif(os.geteuid() != 0 or cgroup.cgroup_version() is None,
                    reason="needs root and a writable memory cgroup")
def test_run_in_cgroup_measures_and_cleans_up() -> None:
    root = cgroup.V1_ROOT if cgroup.cgroup_version() == 1 else cgroup.V2_ROOT
    name = f"moepack-test-{os.getpid()}"
    m = cgroup.run(["python3", "-c", "b = bytearray(32 << 20); print('{\"ok\": 1}')"], 256 << 20,
                   name=name)
    assert m.rc == 0 and m.json_out() == {"ok": 1}
    assert m.max_rss_bytes >= 32 << 20
    assert m.peak_cgroup_bytes is None or m.peak_cgroup_bytes >= 32 << 20
    assert not (root / name).exists()
    # over the limit: not hung but killed by the memory controller (SIGKILL, the charge at the
    # limit; memory.failcnt is no sign of it: 0 after such a kill on Linux 6.18), cgroup removed
    m = cgroup.run(["python3", "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"],
                   64 << 20, name=name + "-over")
    assert m.rc == -signal.SIGKILL, (m.rc, m.stderr_tail)
    assert m.peak_cgroup_bytes is None or m.peak_cgroup_bytes >= (64 << 20) - (1 << 20)
    assert not (root / (name + "-over")).exists()


def test_record_and_expert_bytes_match_the_planner() -> None:
    from moepack.format.layout import plan_layout
    from moepack.format.synthetic import Q8, RVQ3, mixtral_spec

    for s in (Shape(hidden=256, inter=96, experts=4, layers=2, vocab=512, heads=4, kv_heads=2),
              Shape(hidden=512, inter=256, experts=3, layers=1, vocab=300, heads=8, kv_heads=2)):
        spec = mixtral_spec(layers=s.layers, experts=s.experts, hidden=s.hidden, inter=s.inter,
                            vocab=s.vocab, heads=s.heads, kv_heads=s.kv_heads, attn=Q8, embed=Q8,
                            expert=RVQ3)
        assert plan_layout(spec).banks()[0].stride == s.rvq_record_bytes()
    s = Shape()
    assert s.gguf_expert_bytes() == 7_225_344  # 3 x 4096 x 1536 weights: 73,728 blocks of 98 bytes
    # bits per weight: rvq ~3.0 (+ row scales + 4 KiB padding), IQ3_XXS 3.06
    assert 3.0 <= 8 * s.rvq_record_bytes() / s.expert_params() < 3.05
    assert 8 * s.gguf_expert_bytes() / s.expert_params() == pytest.approx(3.0625)


def test_shape_for_size_scales_layers() -> None:
    small, big = shape_for_size(3.0), shape_for_size(10.0)
    assert big.layers > small.layers >= 2
    assert abs(big.approx_bytes() / 1e9 - 10.0) < 1.0  # within one layer (~0.95 GB)
    assert shape_for_size(0.01).layers == 2


def test_tiny_container_written_by_the_generator(tmp_path) -> None:
    from moepack.format.reader import Container

    s = Shape(hidden=256, inter=96, experts=4, top_k=2, layers=2, vocab=512, heads=4,
              kv_heads=2)
    info = write_moepack(tmp_path / "t.moepack", s)
    with Container.open(tmp_path / "t.moepack") as c:
        assert c.manifest["model"]["moe"]["top_k"] == 2
        assert [b["count"] for b in c.banks()] == [4, 4]
        assert c.banks()[0]["stride"] == info["record_bytes"] == s.rvq_record_bytes()


def test_gguf_twin_shapes(tmp_path) -> None:
    gguf = pytest.importorskip("gguf")
    from bench.synthetic_model import write_gguf

    s = Shape(hidden=256, inter=256, experts=4, top_k=2, layers=1, vocab=300, heads=4,
              kv_heads=2)
    write_gguf(tmp_path / "t.gguf", s)
    r = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    t = {x.name: x for x in r.tensors}
    assert list(t["blk.0.ffn_gate_exps.weight"].shape) == [256, 256, 4]  # ne0 = hidden
    assert list(t["blk.0.ffn_down_exps.weight"].shape) == [256, 256, 4]
    assert t["blk.0.ffn_up_exps.weight"].tensor_type == gguf.GGMLQuantizationType.IQ3_XXS
    assert list(t["token_embd.weight"].shape) == [256, 300]


def test_sweep_points_span_floor_to_past_cap() -> None:
    plan = {"floor_bytes": 1000, "step_expert_bytes": 100}
    pts = sweep_points(plan, cap=5000, every=4000)
    budgets = [b for _, b in pts]
    assert budgets == sorted(budgets) and budgets[0] == 1000 and budgets[-1] == 6250
    assert len(set(budgets)) == len(budgets)
    assert all(b >= 1000 for b in budgets)


def test_bandwidth_record_takes_the_most_of_unordered_samples() -> None:
    from bench import run_all

    samples = [33.5, 52.25, 30.0, 41.0]  # the fastest neither first nor last
    rec = run_all.bandwidth_record(samples)
    assert rec == {"memory_read_samples_gb_s": [33.5, 52.25, 30.0, 41.0], "memory_read_gb_s": 52.25}
    samples.append(99.0)  # a copy: later samples do not change a recorded result
    assert rec["memory_read_samples_gb_s"] == [33.5, 52.25, 30.0, 41.0]
    with pytest.raises(ValueError):
        run_all.bandwidth_record([])


def test_markdown_renders_partial_results(tmp_path, monkeypatch) -> None:
    from bench import run_all

    res = {"kind": "quick", "date_utc": "2026-01-01 00:00", "commit": "abc",
           "hardware": {"Model name": "cpu", "CPU(s)": "2", "MemTotal GB": 24, "kernel": "k"},
           "threads": 2, "load_avg_start": [1.0, 1, 1], "prompt": [1, 2], "decode_tokens": 4,
           "llama_cpp": "available", "cgroup_version": 1,
           "model": {"shape": Shape().__dict__, "moepack": {"bytes": 10**9, "embed_bytes": 0},
                     "gguf": {"bytes": 10**9}},
           "plan": {"expert_record_bytes": 7 << 20, "trunk_bytes": 1, "step_expert_bytes": 1,
                    "floor_bytes": 2},
           "disk": {"1": {"gb_s": 0.5}, "4": {"gb_s": 0.8}},
           "caps": [{"frac": 0.25, "cap_bytes": 250 * 10**6,
                     "moepack": {"tok_s": [3.0, 3.0], "hit_rate": [0.1, 0.2],
                                 "budget_bytes": 10**8, "read_bytes": 10**9,
                                 "result": {"load_s": 0.5, "passes": [
                                     {"prompt_seconds": 1.0, "decode_seconds": 1.5}]}},
                     "llama": {"tok_s": [1.0, 0.5], "read_bytes": 10**10,
                               "result": {"load_s": 4.0, "passes": [
                                   {"prompt_s": 1.0, "decode_s": 4.0}]}}}],
           "warm": {"moepack": {"tok_s": [1, 2.0]}, "llama": {"rc": 1, "error": ["boom"]}},
           **run_all.bandwidth_record([31.0, 40.0, 36.5])}
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    (tmp_path / "run_all-quick.json").write_text(json.dumps(res))
    run_all.write_markdown(tmp_path / "B.md")
    md = (tmp_path / "B.md").read_text()
    assert "**3.00** / **6.00** | 3.00 (3.00x) |" in md  # ratios; load + pass 1: 3 s vs 9 s
    assert "| – | 9.00 |" in md  # llama.cpp's own row: its seconds, no ratio
    # the bound's bandwidth: the most of the samples taken beside the warm runs, their range shown
    assert "at 40.00 GB/s (2 threads reading RAM, the most of 3 samples taken next to the warm " \
           "decode runs: 31.00-40.00) =" in md
    assert "| 25% cap: >= 3x llama.cpp decode | 3.00x (pass 1), 6.00x (pass 2) | yes |" in md
    assert "warm: >= 1.0x llama.cpp | not measured" in md
    # sizes through moepack.sizes.format_size, the unit in the cell
    assert "| 25% | 250.000 MB | moepack (default budget) | 100.000 MB |" in md
    assert "records of 7.340 MB" in md


def test_short_prompt_row_beside_the_long_prompts(tmp_path, monkeypatch) -> None:
    """The chat-turn prompt renders in the prompt table with its ratio, with or without the
    long prompts' rows."""
    from bench import run_all

    def run(tok):
        return {"prompt_tok_s": [tok / 4, tok], "rounds_prompt_tok_s": [[1, tok - 1], [1, tok]],
                "read_bytes": 10**6}

    res = {"kind": "quick", "date_utc": "d", "commit": "c", "threads": 2, "rounds": 2,
           "hardware": {"Model name": "cpu", "CPU(s)": "2", "MemTotal GB": 24, "kernel": "k"},
           "load_avg_start": [1.0, 1, 1], "prompt": [1, 2], "decode_tokens": 4,
           "llama_cpp": "available", "cgroup_version": 1,
           "model": {"shape": Shape().__dict__, "moepack": {"bytes": 10**9},
                     "gguf": {"bytes": 10**9}},
           "plan": {"expert_record_bytes": 1, "trunk_bytes": 1, "step_expert_bytes": 1,
                    "floor_bytes": 2}, "disk": {},
           "prompt_short": {"tokens": 32, "moepack": run(30.0), "llama": run(20.0)}}
    md = run_all.section(res)
    assert "### Long prompt (and a 32-token chat turn, warm; issue 15)" in md
    assert "| warm, 32-token prompt | moepack | 30.00" in md and "| **1.50** |" in md
    assert "| warm, 32-token prompt | llama.cpp (IQ3_XXS twin) | 20.00" in md
    res["prompt_long"] = {"tokens": 512, "rows": [{"frac": None, "moepack": run(90.0),
                                                   "llama": run(60.0)}]}
    md = run_all.section(res)
    assert "### Long prompt (512 tokens and a 32-token chat turn, warm; issue 15)" in md
    assert md.index("| warm | moepack | 90.00") < md.index("| warm, 32-token prompt | moepack")
    longer = run(370.0)
    longer["result"] = {"passes": [{"chunk": 512, "longest_pass": 2048}]}
    res["prompt_longer"] = {"tokens": 2048, "frac": 0.5, "moepack": longer,
                            "llama": run(185.0)}
    md = run_all.section(res)
    assert ("### Long prompt (512 tokens and a 32-token chat turn, warm, 2048 tokens under a "
            "50% cap; issue 15)") in md
    assert ("| 50%, 2048-token prompt | moepack (1 pass of up to 2048 tokens, borrowing the cache "
            "beyond its held 512) | 370.00") in md and "| **2.00** |" in md
    longer["result"]["passes"][0]["longest_pass"] = 512  # the held chunk's passes
    assert "moepack (4 passes of up to 512 tokens) |" in run_all.section(res)


def test_bandwidth_bound_above_one_is_not_a_verdict() -> None:
    """A decode faster than the run's own RAM probe allows means the probe ran slow: no "yes"."""
    from bench import run_all

    res = {"threads": 2, "memory_read_gb_s": 1.0,
           "model": {"shape": {"vocab": 1000}, "moepack": {"embed_bytes": 0}},
           "plan": {"trunk_bytes": 10**8, "step_expert_bytes": 10**8},
           "warm": {"moepack": {"tok_s": [4.0, 8.0]}}}  # bound 5 tok/s, decode 8: 1.6 of it
    goals = run_all.goals_kernels_prompt(res)
    assert "| 1.60 of 5.00 tok/s | – (the RAM probe read slower than decode) |" in goals
    res["memory_read_gb_s"] = 4.0  # bound 20 tok/s: 0.4 of it, a real "no"
    assert "| 0.40 of 20.00 tok/s | no |" in run_all.goals_kernels_prompt(res)


def test_bandwidth_bound_reads_one_row_of_the_input_embedding() -> None:
    """A decode step reads one row of a separate embedding table, so the bound leaves the rest
    of it out; results that did not record the table give no bound rather than a wrong one."""
    from bench import run_all

    res = {"threads": 2, "memory_read_gb_s": 1.0,
           "model": {"shape": {"vocab": 1000}, "moepack": {"embed_bytes": 4 * 10**7}},
           "plan": {"trunk_bytes": 10**8, "step_expert_bytes": 10**8},
           "warm": {"moepack": {"tok_s": [2.0, 4.0]}}}
    assert run_all.step_bytes(res) == 10**8 - 4 * 10**7 + 4 * 10**4 + 10**8
    assert "| 0.64 of 6.25 tok/s |" in run_all.goals_kernels_prompt(res)  # 1e9 / 160.04e6
    del res["model"]["moepack"]["embed_bytes"]
    assert run_all.step_bytes(res) is None
    assert "of the memory-bandwidth bound" not in run_all.goals_kernels_prompt(res)


def test_embed_table_bytes_reads_the_container(tmp_path) -> None:
    """The table's bytes come from the container's index (f16, 128 x 64)."""
    from bench import run_all
    from format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "m.moepack"
    write_synthetic(path, mixtral_spec(vocab=128, hidden=64))
    assert run_all.embed_table_bytes(path) == 128 * 64 * 2


def test_cap_goal_reports_the_start_to_pass_1_time_beside_the_tok_s_verdict() -> None:
    """Pass 1's tok/s leaves the load out; the goal row adds load + pass 1 and keeps its
    verdict on tok/s."""
    from bench import run_all

    def run(tok, load, prompt, decode):
        return {"tok_s": tok, "result": {"load_s": load, "passes": [
            {"prompt_seconds": prompt, "decode_seconds": decode}]}}

    res = {"caps": [{"frac": 1.1, "moepack": run([1.0, 4.0], 0.2, 0.5, 0.8),
                     "llama": run([2.0, 2.0], 1.5, 0.6, 0.5)}]}
    goals = run_all.goals_kernels_prompt(res)
    assert ("| 0.50x / 2.00x (default budget); start to pass 1's end 1.73x | no |"
            in goals), goals
    del res["caps"][0]["llama"]["result"]  # no timings: no claim
    assert "(default budget) | no |" in run_all.goals_kernels_prompt(res)


def test_capped_prompt_goal_says_what_bounds_it() -> None:
    """The capped prompt's row gives moepack's share of time waiting for reads and the ratio its
    own warm prompt speed would give: a small wait means the compute, not the disk, caps it."""
    from bench import run_all

    def run(tok, wait=None, seconds=None):
        r = {"prompt_tok_s": [tok], "read_bytes": 10**9}
        if wait is not None:
            r["result"] = {"passes": [{"io_wait_seconds": wait, "prompt_seconds": seconds}]}
        return r

    res = {"prompt_long": {"tokens": 512, "rows": [
        {"frac": None, "moepack": run(60.0), "llama": run(66.0)},
        {"frac": 0.25, "moepack": run(50.0, 0.5, 10.0), "llama": run(40.0)}]}}
    goals = run_all.goals_kernels_prompt(res)
    assert ("| 1.25x (read 1.000 GB vs 1.000 GB; moepack waited for reads 5 %, 1.50x at its "
            "warm prompt speed) | no |") in goals, goals
    del res["prompt_long"]["rows"][0]  # no warm row: the wait alone
    assert "waited for reads 5 %) | no |" in run_all.goals_kernels_prompt(res)


def test_forced_token_stream_is_fixed_varied_and_in_range() -> None:
    from bench.run_all import forced_tokens

    a, b = forced_tokens(48, 8192), forced_tokens(48, 8192)
    assert a == b and len(a) == 48
    assert all(3 <= t < 8192 for t in a)  # never the special ids 0..2
    assert len(set(a)) > 40
    assert forced_tokens(16, 8192) == a[:16]  # shorter runs are a prefix: same ids everywhere


def test_kernel_bench_ram_mode_spans_twice_the_l3() -> None:
    """The "RAM" mode must not fit in the last-level cache (a Xeon VM reports 480 MiB)."""
    from bench.kernels import ram_mode_mib

    assert ram_mode_mib("480 MiB (1 instance)") == 960
    assert ram_mode_mib("32 MiB (1 instance)") == 256
    assert ram_mode_mib("1.5 GiB (2 instances)") == 3072
    assert ram_mode_mib("") == 256 and ram_mode_mib("512 KiB") == 256


def test_kernel_bench_says_when_the_engines_spans_differed() -> None:
    """Results from before both harnesses shared the span name moepack's own (128 MiB)."""
    from bench.kernels import moepack_span

    assert moepack_span({"ram_mib": 256}) == " (128 MiB for moepack's harness)"
    assert moepack_span({"ram_mib": 960, "moepack_ram_mib": 960}) == ""
