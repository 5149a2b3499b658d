"""Conversion throughput and memory: `python -m bench.convert [--size-gb 1] [--jobs 1,2,ray]`.

1. Encoder rates (bench/convert_rates.py, skip with --no-rates): expert weights/s per core and
   codebook training CPU-s for every preset on full-size expert shapes (7168x2048, 4096x1536),
   and the conversion-time estimates for real models derived from them.
2. End to end: builds a synthetic Mixtral-style bf16 checkpoint of about --size-gb (random
   weights, expert shape --shape, generated tensor by tensor, never committed), converts it with
   each --jobs value through the real CLI (`moepack convert --json` in a subprocess; `ray`: on a
   2-node local Ray cluster with one CPU per node, started for the run), and reports expert
   weights/s, weights/s per core, the scaling ratio against the first run, peak RSS of the
   largest worker, and whether all outputs are byte-identical. With both `2` and `ray` in
   --jobs: Ray's overhead at equal cores (2 local workers vs 2 one-CPU nodes), in %.
   --repeat N runs the --jobs values N times, interleaved (load drifts on a shared machine),
   and reports each one's median (lower median: of 2 runs, the faster). --quick: a small run
   (2 layers of 8 1024x512 experts, rvq3-baseline, --jobs 2,ray, no encoder rates) to check
   the Ray row in a few minutes.
Results go to docs/CONVERT.md by hand, with hardware, commit, date and machine load; its
rates and per-model estimates section is regenerated from the recorded rates by
`python -m bench.convert_rates --write`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from moepack.convert.st_writer import write_safetensors

from bench import convert_rates
from bench.machine import cpu_model, git_commit, utc_now

HIDDEN, INTER, EXPERTS, VOCAB = 1024, 512, 32, 1024


def make_checkpoint(out: Path, size_gb: float, seed: int = 0, hidden: int = HIDDEN,
                    inter: int = INTER, experts: int = EXPERTS) -> tuple[Path, int]:
    """A Mixtral-style checkpoint whose experts total about size_gb; returns (dir, experts)."""
    HIDDEN, INTER, EXPERTS = hidden, inter, experts  # noqa: N806 (the config's names)
    layers = max(1, round(size_gb * 1e9 / (EXPERTS * 3 * HIDDEN * INTER * 2)))
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


def run(src: Path, out: Path, jobs: str, extra: list[str]) -> dict:
    if jobs == "ray":  # a 2-node local cluster, one CPU each (the same 2 cores as --jobs 2)
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from ray_cluster import local_cluster

        with local_cluster(nodes=2, cpus=1) as c:
            return _run(src, out, ["--ray", c.address], extra)
    return _run(src, out, ["--jobs", jobs], extra)


def _run(src: Path, out: Path, how: list[str], extra: list[str]) -> dict:
    cmd = ["nice", "-n", "10", sys.executable, "-m", "moepack", "convert", str(src), str(out),
           *how, "--json", *extra]
    t = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t
    if res.returncode != 0:
        raise SystemExit(f"convert {' '.join(how)} failed:\n{res.stderr}")
    summary = json.loads(res.stdout)
    summary["wall_seconds"] = round(wall, 2)
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0, help="expert bytes of the source (bf16)")
    ap.add_argument("--jobs", default="1,2,ray",
                    help="comma-separated --jobs values; ray: a 2-node local Ray cluster")
    ap.add_argument("--shape", default="4096x1536", help="expert HIDDENxINTERMEDIATE")
    ap.add_argument("--experts", type=int, default=8, help="experts per layer")
    ap.add_argument("--no-rates", action="store_true", help="skip the encoder-rate part")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and outputs")
    ap.add_argument("--repeat", type=int, default=1, help="runs per --jobs value (median)")
    ap.add_argument("--quick", action="store_true",
                    help="small: --size-gb 0.05 --shape 1024x512 --experts 8 --jobs 2,ray "
                    "--no-rates, rvq3-baseline")
    ap.add_argument("convert_args", nargs="*", help="extra `moepack convert` options after --")
    args = ap.parse_args(argv)
    if args.quick:
        args.size_gb, args.shape, args.experts, args.jobs = 0.05, "1024x512", 8, "2,ray"
        args.no_rates = True
        if "--expert-codec" not in args.convert_args:
            args.convert_args += ["--expert-codec", "rvq3-baseline"]
    rates = [] if args.no_rates else convert_rates.measure(
        log=lambda line: print(line, file=sys.stderr))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="moepack-bench-convert-"))
    hidden, inter = (int(x) for x in args.shape.split("x"))
    try:
        t = time.monotonic()
        src, experts = make_checkpoint(work / "src", args.size_gb, hidden=hidden, inter=inter,
                                       experts=args.experts)
        src_bytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        print(f"synthetic checkpoint: {src_bytes / 1e9:.2f} GB, {experts} experts "
              f"({time.monotonic() - t:.0f} s to generate)", file=sys.stderr)
        runs: dict[str, list[dict]] = {}
        outputs: list[Path] = []
        for i in range(args.repeat):
            for jobs in args.jobs.split(","):
                out = work / f"out-j{jobs}-{i}.moepack"
                load = os.getloadavg()[0]
                s = run(src, out, jobs, args.convert_args)
                s["load_avg_1m_before"] = load
                print(json.dumps({"jobs": jobs, "seconds": s["seconds"], "load": load}),
                      file=sys.stderr)
                runs.setdefault(jobs, []).append(s)
                if not outputs:
                    outputs.append(out)
                else:  # keep disk use to two outputs
                    s["identical_to_first"] = _same(outputs[0], out)
                    out.unlink()
        rows = []
        for jobs, done in runs.items():
            # the median run; of two middle ones the faster (the less disturbed by other load)
            s = sorted(done, key=lambda d: d["seconds"])[(len(done) - 1) // 2]
            weights = experts * 3 * hidden * inter
            rows.append({"jobs": jobs, "seconds": s["seconds"], "runs": len(done),
                         "all_seconds": [d["seconds"] for d in done],
                         "load_avg_1m_before": s["load_avg_1m_before"],
                         "experts_per_s": round(experts / s["seconds"], 3),
                         "expert_weights_per_s": round(weights / s["seconds"]),
                         "expert_weights_per_s_per_core": round(weights / s["seconds"] / 2),
                         "ray_nodes": s.get("ray_nodes", 0),
                         "source_mb_per_s": round(src_bytes / 1e6 / s["seconds"], 2),
                         "peak_rss_worker_mb": round(s["peak_rss_worker"] / 2**20, 1),
                         "file_size": s["file_size"],
                         "expert_bits_per_weight": s["expert_bits_per_weight"],
                         "identical_to_first": all(d.get("identical_to_first", True)
                                                   for d in done)})
            print(json.dumps(rows[-1]), file=sys.stderr)
        for r in rows:
            r["scaling_vs_first"] = round(rows[0]["seconds"] / r["seconds"], 3)
        by = {r["jobs"]: r for r in rows}
        overhead = None
        if "2" in by and "ray" in by:  # equal cores: 2 local workers vs 2 one-CPU nodes
            overhead = round((by["ray"]["seconds"] / by["2"]["seconds"] - 1) * 100, 1)
        # cores: the machine's (the record describes the hardware), not this process's share
        report = {"date": utc_now(),
                  "commit": git_commit(), "cpu": cpu_model(), "cores": os.cpu_count(),
                  "load_avg_1m": round(os.getloadavg()[0], 2), "source_bytes": src_bytes,
                  "experts": experts, "expert_shape": [hidden, inter],
                  "convert_args": args.convert_args, "runs": rows,
                  "ray_overhead_pct_vs_jobs_2": overhead,
                  "rates": [asdict(r) for r in rates],
                  "estimates_hours": {f"{p} x {c} cores": convert_rates.estimate(rates, p, c)
                                      for p in ("rvq3-l", "rvq3", "rvq3-baseline")
                                      for c in (2, 16, 64, 512) if rates}}
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
