"""Benchmark of the C engine: decode speed warm (every expert cached) and cold (no cache,
O_DIRECT reads), and the expert read bandwidth achieved during cold decode against the disk's own
random-read bandwidth at the same record size and queue depth, measured in the same run.

    python -m bench.runtime [--dir DIR] [--layers 8] [--experts 48] [--tokens 8] [--threads N]

The container is synthetic (format.synthetic: random rvq codes, q8 attention, f16 embeddings)
with realistic expert shapes (default hidden 4096, moe_intermediate 1536, top-8: Qwen3-235B-A22B
experts, 7.1 MB records with 3-stage rvq); about 2 GB with the defaults. Random codes are fine for
speed. Prints a markdown block for docs/RUNTIME.md. The container is deleted unless --keep.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from moepack.format.synthetic import mixtral_spec, write_synthetic
from moepack.runtime.engine import Engine, plan

from bench.disk import drop_cache, random_read
from bench.machine import git_commit, machine_line, utc_now
from moepack.sysinfo import usable_cores


def build(path: Path, layers: int, experts: int, hidden: int, inter: int, top_k: int) -> float:
    spec = mixtral_spec(layers=layers, experts=experts, hidden=hidden, inter=inter, vocab=4096,
                        heads=32, kv_heads=8)
    spec.manifest["model"]["moe"]["top_k"] = top_k
    spec.manifest["source"]["config"]["num_experts_per_tok"] = top_k
    t0 = time.perf_counter()
    write_synthetic(path, spec, overwrite=True)
    return time.perf_counter() - t0


PROMPT = list(range(1, 33))  # 32 tokens = 2 prefill chunks


def decode(path: Path, tokens: int, repeat: int, **kw) -> dict:
    """Generate `tokens` after a 32-token prompt `repeat` times; stats of the last run."""
    with Engine(str(path), ctx=256, **kw) as e:
        for _ in range(repeat):
            e.reset_stats()
            c0 = time.process_time()
            list(e.generate(PROMPT, tokens))
            cpu = time.process_time() - c0
        s = e.stats()
    s["cpu_s_per_token"] = cpu / (s["prompt_tokens"] + s["decode_tokens"])
    return s


def row(name: str, s: dict) -> str:
    bw = s["bytes_read"] / s["io_wait_seconds"] / 1e9 if s["io_wait_seconds"] > 0 else 0.0
    return (f"| {name} | {s['prompt_tok_s']:.2f} | {s['decode_tok_s']:.2f} | "
            f"{100 * s['hit_rate']:.0f}% | "
            f"{s['bytes_read'] / 1e9:.2f} | {100 * s['io_wait_share']:.0f}% | {bw:.2f} | "
            f"{'on' if s['o_direct'] else 'off'} | {s['cpu_s_per_token']:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    d = a.dir or Path(tempfile.mkdtemp(prefix="moepack-bench-", dir="/var/tmp"))
    d.mkdir(parents=True, exist_ok=True)
    path = d / "bench.moepack"
    load0 = os.getloadavg()[0]
    t_build = build(path, a.layers, a.experts, a.hidden, a.inter, a.top_k)
    p = plan(str(path), 256)
    rec, size = p["expert_record_bytes"], path.stat().st_size
    threads = a.threads or usable_cores()
    every = a.layers * a.experts * rec
    try:
        # warm: budget holds every expert; the second identical run is all hits
        warm = decode(path, a.tokens, 2, threads=threads,
                      budget=p["floor_bytes"] + every + (64 << 20))
        # cold: no cache, O_DIRECT, file dropped from the page cache
        drop_cache(path)
        cold = decode(path, a.tokens, 1, threads=threads, cache_experts=0, o_direct=True,
                      prefetch=False)
        drop_cache(path)
        look = decode(path, a.tokens, 1, threads=threads, cache_experts=2 * a.top_k,
                      o_direct=True, prefetch=True)
        drop_cache(path)
        nolook = decode(path, a.tokens, 1, threads=threads, cache_experts=2 * a.top_k,
                        o_direct=True, prefetch=False)
        qd = min(a.top_k, 4)  # reads in flight: one layer's top-k over the 4 reader threads
        drop_cache(path)
        disk = random_read(path, rec, qd, seconds=4.0)
        disk1 = random_read(path, rec, 1, seconds=3.0)
    finally:
        if not a.keep:
            path.unlink(missing_ok=True)
    load1 = os.getloadavg()[0]
    cold_bw = cold["bytes_read"] / cold["io_wait_seconds"] / 1e9 if cold["io_wait_seconds"] else 0
    print(f"### Runtime benchmark ({utc_now()}, commit {git_commit()})\n")
    print(f"- Hardware: {machine_line()}; compute threads {threads}.")
    print(f"- Load average (1 min) at start / end: {load0:.1f} / {load1:.1f}.")
    print(f"- Container: synthetic, {size / 1e9:.2f} GB, {a.layers} MoE layers x {a.experts} "
          f"experts, hidden {a.hidden}, moe_intermediate {a.inter}, top-{a.top_k}, rvq 3 stages; "
          f"record {rec / 1e6:.2f} MB; one token reads {p['step_expert_bytes'] / 1e9:.2f} GB "
          f"cold; written in {t_build:.1f} s.")
    print(f"- Plan (ctx 256): trunk {p['trunk_bytes'] / 1e9:.3f} GB, floor "
          f"{p['floor_bytes'] / 1e9:.3f} GB.\n")
    print("| run | prompt tok/s | decode tok/s | cache hits | GB read | I/O wait |"
          " read GB/s while waiting | O_DIRECT | CPU s/token (all threads) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(row("warm (all cached)", warm))
    print(row("cold (no cache)", cold))
    print(row(f"small cache ({2 * a.top_k} records), look-ahead on", look))
    print(row(f"small cache ({2 * a.top_k} records), look-ahead off", nolook))
    print(f"\n- Disk, O_DIRECT random reads of {rec / 1e6:.2f} MB: {disk.gb_per_s:.2f} GB/s at "
          f"queue depth {qd}, {disk1.gb_per_s:.2f} GB/s at depth 1 (O_DIRECT: {disk.o_direct}).")
    print(f"- Cold decode expert reads: {cold_bw:.2f} GB/s while the compute thread waited = "
          f"{cold_bw / disk.gb_per_s if disk.gb_per_s else 0:.2f} of the disk at depth {qd} "
          "(goal >= 0.9).")


if __name__ == "__main__":
    main()
