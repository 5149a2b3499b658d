"""Prompt speed of the linear-attention layers (issue 17): the chunk form of the delta rule
against the token form, on tiny-but-wide models with the published head shapes, everything
cached.

    python -m bench.linear_prompt [--tokens 512] [--threads 1] [--rounds 5] [--lib OLD.so]

Qwen3-Next-shaped: 16 key / 32 value heads x 128 (Qwen3-Next-80B's), 3 Gated DeltaNet layers +
1 full-attention layer; Kimi-Linear-shaped: 32 KDA heads x 128 (Kimi-Linear-48B's), 3 KDA + 1
MLA layer; hidden 256 and small experts, so the recurrence is a large share of the time. Each
row runs one prompt of --tokens tokens in chunks of --chunk; the variants (linear_chunk 1 = token
form, then the sub-chunks asked for, and with --lib an engine library built from another commit)
alternate, every round flipping the order; the best of --rounds is kept with every round's
speed, the median, and the median over rounds of each row's ratio to the token form in the same
round (runs next to each other in time, so on a shared machine the steadiest figure); the
process is pinned to --threads CPUs.  Prints one JSON line per model.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import git_commit, lscpu, machine_line, utc_now
from bench.run_all import alternate

ROOT = Path(__file__).resolve().parent.parent

WIDE = {  # head shapes of the published models; the rest as tests/tiny_models.py
    "qwen3_next": dict(hidden_size=256, linear_num_key_heads=16, linear_num_value_heads=32,
                       linear_key_head_dim=128, linear_value_head_dim=128),
    "kimi_linear": dict(hidden_size=256, linear_attn_config={
        "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
        "full_attn_layers": [2], "kda_layers": [1, 3, 4]}),
}


def build(arch: str, folder: Path) -> Path:
    """`arch`'s wide model converted to folder/m.moepack (kept: built once per folder)."""
    out = folder / arch / "m.moepack"
    if out.exists():
        return out
    sys.path.insert(0, str(ROOT / "tests"))
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from tiny_models import make_checkpoint

    make_checkpoint(arch, folder / arch / "src", max_position_embeddings=4096, **WIDE[arch])
    convert(folder / arch / "src", out, Settings())
    return out


def use_library(path: str) -> None:
    """Engines opened from here on load `path` (an engine built from another commit: its
    mp_config ends before linear_chunk, which it then never reads)."""
    from moepack.runtime import _lib

    lib = ctypes.CDLL(path)
    lib.mp_version.restype = ctypes.c_char_p
    _lib.load = lambda: lib


def prompt_run(path: Path, prompt: list[int], threads: int, chunk: int, linear_chunk: int):
    from moepack.runtime.engine import Engine

    def run() -> dict:
        with Engine(str(path), threads=threads, chunk=chunk, ctx=len(prompt) + 8,
                    linear_chunk=linear_chunk) as e:
            e.feed(prompt[:chunk])  # first touch: trunk pages, experts into the cache
            e.reset()
            t0 = time.perf_counter()
            e.feed(prompt)
            return {"prompt_tok_s": [round(len(prompt) / (time.perf_counter() - t0), 2)]}
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256, help="prompt tokens per forward pass")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sub", default="16,32,64", help="chunk-form sub-chunks to run")
    ap.add_argument("--models", default="qwen3_next,kimi_linear")
    ap.add_argument("--lib", help="also run this engine library (built at another commit) as 'lib'")
    ap.add_argument("--engine", help="the engine library of the linear_chunk rows (default: the "
                    "installed one; a private copy cannot be rebuilt under a run)")
    ap.add_argument("--dir", type=Path, help="where the models are built (kept)")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))[:a.threads]  # every row on the same CPUs
    os.sched_setaffinity(0, cpus)
    if a.engine:
        use_library(a.engine)
    folder = a.dir or Path(tempfile.mkdtemp(prefix="moepack-linear-", dir="/var/tmp"))
    prompt = [3 + (7 * i) % 60 for i in range(a.tokens)]
    for arch in a.models.split(","):
        path = build(arch, folder)
        runs = {f"L{s}": prompt_run(path, prompt, a.threads, a.chunk, int(s))
                for s in ["1", *a.sub.split(",")]}
        if a.lib:
            from moepack.runtime import _lib

            own = _lib.load
            inner = prompt_run(path, prompt, a.threads, a.chunk, 0)

            def other(inner=inner, own=own) -> dict:
                use_library(a.lib)
                try:
                    return inner()
                finally:
                    _lib.load = own
            runs["lib"] = other
        load0 = os.getloadavg()
        got = alternate(a.rounds, runs, metric="prompt_tok_s")
        best = {k: v["prompt_tok_s"][-1] for k, v in got.items()}
        median = {k: statistics.median(r[-1] for r in v["rounds_prompt_tok_s"])
                  for k, v in got.items()}
        # each round's runs are neighbours in time: their ratio cancels most of the load's drift
        token = [r[-1] for r in got["L1"]["rounds_prompt_tok_s"]]
        paired = {k: round(statistics.median(r[-1] / t for r, t in
                                             zip(v["rounds_prompt_tok_s"], token, strict=True)), 3)
                  for k, v in got.items()}
        print(json.dumps({
            "model": arch, "commit": git_commit(), "date": utc_now(), "machine": machine_line(),
            "cpu": lscpu(), "tokens": a.tokens, "chunk": a.chunk, "threads": a.threads,
            "cpus": cpus,
            "best_prompt_tok_s": best,
            "rounds_prompt_tok_s": {k: v["rounds_prompt_tok_s"] for k, v in got.items()},
            "vs_token_form": {k: round(v / best["L1"], 2) for k, v in best.items()},
            "median_prompt_tok_s": median,
            "median_vs_token_form": {k: round(v / median["L1"], 2) for k, v in median.items()},
            "median_round_ratio_to_token_form": paired,
            "engine": a.engine or "installed", "lib": a.lib,
            "load_avg_before_after": [round(load0[0], 1), round(os.getloadavg()[0], 1)]}),
            flush=True)


if __name__ == "__main__":
    main()
