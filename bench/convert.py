"""Conversion throughput and memory: `python -m bench.convert [--size-gb 1] [--jobs 1,2]`.

Builds a synthetic Mixtral-style bf16 checkpoint of about --size-gb (random weights, generated
tensor by tensor, never committed), converts it with each --jobs value through the real CLI
(`moepack convert --json` in a subprocess), and reports experts/s, source MB/s, the scaling ratio
against the first --jobs value, peak RSS of the largest worker, and whether all outputs are
byte-identical. Results go to docs/CONVERT.md by hand, with hardware, commit and date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from moepack.convert.st_writer import write_safetensors

HIDDEN, INTER, EXPERTS, VOCAB = 1024, 512, 32, 1024
EXPERT_BYTES = 3 * HIDDEN * INTER * 2  # bf16


def make_checkpoint(out: Path, size_gb: float, seed: int = 0) -> tuple[Path, int]:
    """A Mixtral-style checkpoint whose experts total about size_gb; returns (dir, experts)."""
    layers = max(1, round(size_gb * 1e9 / (EXPERTS * EXPERT_BYTES)))
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
           "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 2,
           "num_local_experts": EXPERTS, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
           "rope_theta": 1e6, "max_position_embeddings": 4096, "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    rng = np.random.default_rng(seed)
    weight_map = {}
    for layer in range(layers):  # one shard per layer, like the Hub's multi-GB shards
        p = f"model.layers.{layer}"
        shapes = {f"{p}.input_layernorm.weight": (HIDDEN,),
                  f"{p}.post_attention_layernorm.weight": (HIDDEN,),
                  f"{p}.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                  f"{p}.self_attn.k_proj.weight": (HIDDEN // 4, HIDDEN),
                  f"{p}.self_attn.v_proj.weight": (HIDDEN // 4, HIDDEN),
                  f"{p}.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                  f"{p}.block_sparse_moe.gate.weight": (EXPERTS, HIDDEN)}
        for e in range(EXPERTS):
            q = f"{p}.block_sparse_moe.experts.{e}"
            shapes.update({f"{q}.w1.weight": (INTER, HIDDEN), f"{q}.w3.weight": (INTER, HIDDEN),
                           f"{q}.w2.weight": (HIDDEN, INTER)})
        if layer == 0:
            shapes.update({"model.embed_tokens.weight": (VOCAB, HIDDEN),
                           "lm_head.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)})
        fname = f"model-{layer + 1:05d}-of-{layers:05d}.safetensors"
        write_safetensors(out / fname, sorted(shapes.items()), "bf16",
                          lambda n, s=shapes: _weights(rng, s[n]))
        weight_map.update(dict.fromkeys(shapes, fname))
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out, layers * EXPERTS


def _weights(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) == 1:
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    # heavy-ish tails like trained weights (Student t, 5 d.o.f.)
    return (0.02 * rng.standard_t(5, size=shape)).astype(np.float32)


def run(src: Path, out: Path, jobs: int, extra: list[str]) -> dict:
    cmd = ["nice", "-n", "10", sys.executable, "-m", "moepack", "convert", str(src), str(out),
           "--jobs", str(jobs), "--json", *extra]
    t = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t
    if res.returncode != 0:
        raise SystemExit(f"convert --jobs {jobs} failed:\n{res.stderr}")
    summary = json.loads(res.stdout)
    summary["wall_seconds"] = round(wall, 2)
    return summary


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0, help="expert bytes of the source (bf16)")
    ap.add_argument("--jobs", default="1,2", help="comma-separated --jobs values")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and outputs")
    ap.add_argument("convert_args", nargs="*", help="extra `moepack convert` options after --")
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="moepack-bench-convert-"))
    try:
        t = time.monotonic()
        src, experts = make_checkpoint(work / "src", args.size_gb)
        src_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        print(f"synthetic checkpoint: {src_bytes / 1e9:.2f} GB, {experts} experts "
              f"({time.monotonic() - t:.0f} s to generate)", file=sys.stderr)
        rows, outputs = [], []
        for jobs in (int(j) for j in args.jobs.split(",")):
            out = work / f"out-j{jobs}.moepack"
            s = run(src, out, jobs, args.convert_args)
            outputs.append(out)
            rows.append({"jobs": jobs, "seconds": s["seconds"],
                         "experts_per_s": round(experts / s["seconds"], 3),
                         "source_mb_per_s": round(src_bytes / 1e6 / s["seconds"], 2),
                         "peak_rss_worker_mb": round(s["peak_rss_worker"] / 2**20, 1),
                         "file_size": s["file_size"],
                         "expert_bits_per_weight": s["expert_bits_per_weight"]})
            print(json.dumps(rows[-1]), file=sys.stderr)
            if len(outputs) > 1:  # keep disk use to two outputs
                same = _same(outputs[0], outputs[-1])
                rows[-1]["identical_to_first"] = same
                outputs[-1].unlink()
        for r in rows:
            r["scaling_vs_first"] = round(rows[0]["seconds"] / r["seconds"], 3)
        report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "commit": _commit(), "cpu": _cpu(), "cores": os.cpu_count(),
                  "load_avg_1m": round(os.getloadavg()[0], 2), "source_bytes": src_bytes,
                  "experts": experts, "expert_shape": [HIDDEN, INTER],
                  "convert_args": args.convert_args, "runs": rows}
        print(json.dumps(report, indent=2))
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _same(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 24), fb.read(1 << 24)
            if x != y:
                return False
            if not x:
                return True


if __name__ == "__main__":
    main()
