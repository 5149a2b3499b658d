"""How far the chunk form of the delta rule moves the logits from the token form (issue 17), on
the tiny linear-attention models of the tests over long prompts.

    python -m bench.linear_bound [--positions 512,2048] [--seeds 4] [--dir DIR]

Each family's tiny container (tests/tiny_containers.py, max_position_embeddings raised to 4096;
kimi_k3_dense: K3 with every layer dense, no routed experts) runs random prompts with
linear_chunk 1 (token form) and the default sub-chunk, in prompt chunks of 256, one thread, with
f32 and with f16 (the default) KV entries.  Per run: per position the largest |Δlogit| over the
largest |logit| of the token form's sequence (the figure docs/RUNTIME.md bounds), its largest
and median over positions, and for scale the same between f32 and f16 KV entries (another
rounding-level change).  Prints one JSON line per model, length and seed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.machine import git_commit, machine_line, utc_now

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("qwen3_next", "qwen3_5_moe", "kimi_linear", "glm5_next", "kimi_k3", "kimi_k3_dense")


def container(arch: str, folder: Path) -> Path:
    """`arch`'s tiny checkpoint with a 4096-position context, converted (kept in folder)."""
    out = folder / arch / "m.moepack"
    if out.exists():
        return out
    sys.path.insert(0, str(ROOT / "tests"))
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from tiny_containers import tiny_source

    if arch == "kimi_k3_dense":
        from k3_checkpoint import make_k3_checkpoint

        src = make_k3_checkpoint(folder / arch / "src", first_k_dense_replace=4)
    else:
        src = tiny_source(arch, folder / arch / "src")
    cfg_path = src / "config.json"
    cfg = json.loads(cfg_path.read_text())
    (cfg.get("text_config") or cfg)["max_position_embeddings"] = 4096
    cfg_path.write_text(json.dumps(cfg, indent=1))
    convert(src, out, Settings())
    return out


def rel(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """largest |a - b| / largest |b|, and the median over positions of the per-position maximum"""
    scale = float(np.abs(b).max())
    per = np.abs(a - b).max(axis=1) / scale
    return float(per.max()), float(np.median(per))


def logits(path: Path, n: int, seed: int, **kw) -> np.ndarray:
    """One thread, prompt chunks of 256, n random tokens of `seed`"""
    from moepack.runtime.engine import Engine

    with Engine(str(path), threads=1, chunk=256, ctx=n, **kw) as e:
        return e.logits(np.random.default_rng(seed).integers(3, e.vocab_size, n).tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", default="512,2048")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--models", default=",".join(ARCHS))
    ap.add_argument("--dir", type=Path, help="where the containers are built (kept)")
    a = ap.parse_args()
    folder = a.dir or Path(tempfile.mkdtemp(prefix="moepack-linear-bound-", dir="/var/tmp"))
    for arch in a.models.split(","):
        path = container(arch, folder)
        for n in map(int, a.positions.split(",")):
            for seed in range(a.seeds):
                token = {kv: logits(path, n, seed, kv=kv, linear_chunk=1) for kv in ("f32", "f16")}
                row = {"model": arch, "positions": n, "seed": seed}
                for kv in ("f32", "f16"):
                    row[f"chunk_vs_token_{kv}"] = rel(logits(path, n, seed, kv=kv), token[kv])
                row["f16kv_vs_f32kv"] = rel(token["f16"], token["f32"])
                print(json.dumps({**row, "largest_median": "per position |Δlogit| / scale",
                                  "commit": git_commit(), "date": utc_now(),
                                  "machine": machine_line()}), flush=True)


if __name__ == "__main__":
    main()
