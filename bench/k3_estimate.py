"""A Kimi K3 speed estimate from a synthetic K3-shaped container (docs/K3.md, issue 21): the
published config (docs/configs/Kimi-K3.json) cut to 4 layers (3 KDA + 1 MLA; layer 0 dense, 3
MoE layers), 32 experts per layer of the full [3072, 3584] size, vocabulary 16384; random codes.
Measures seconds per decoded token and bytes read with the expert cache off (every routed
record read from disk, O_DIRECT) and with every expert cached, then extrapolates per MoE layer
to K3's 92.  An estimate: random weights overflow the activations (the logits are not computed,
routing degenerates), and this machine's cores and disk are not the peer's.

    .venv/bin/python -m bench.k3_estimate [--out /tmp/k3x4.moepack]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from moepack.convert.plan import plan_for_config
from moepack.convert.settings import Settings
from moepack.format.synthetic import write_synthetic
from moepack.runtime.engine import Engine

CONFIG = Path(__file__).resolve().parent.parent / "docs" / "configs" / "Kimi-K3.json"
MOE_LAYERS, K3_MOE_LAYERS, TOKENS = 3, 92, 6


def build(out: Path) -> None:
    cfg = json.loads(CONFIG.read_text())
    t = cfg["text_config"]
    t.update(num_hidden_layers=4, num_experts=32, vocab_size=16384, attn_res_block_size=4)
    t["linear_attn_config"] = {**t["linear_attn_config"], "full_attn_layers": [4],
                               "kda_layers": [1, 2, 3]}
    write_synthetic(out, plan_for_config(cfg, Settings()).spec, random_experts=True,
                    overwrite=True)


def measure(path: Path, cache_experts: int) -> tuple[float, float]:
    """(seconds, bytes read) per decoded token after a one-token prompt."""
    with Engine(str(path), threads=2, cache_experts=cache_experts) as e:
        if cache_experts:
            e._eval(list(range(7, 20)), None, False)  # load the experts first
            e.reset()
        # no logits: the random weights overflow them, and only the time is wanted here
        e._eval([1], None, False)
        e.reset_stats()
        t0 = time.perf_counter()
        for tok in range(2, 2 + TOKENS):
            e._eval([tok], None, False)
        s = e.stats()
        return (time.perf_counter() - t0) / TOKENS, s["bytes_read"] / TOKENS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/k3x4.moepack"))
    args = ap.parse_args()
    if not args.out.exists():
        build(args.out)
    cold, cold_bytes = measure(args.out, 0)
    warm, _ = measure(args.out, -1)
    per_layer_warm = warm / MOE_LAYERS
    per_layer_io = (cold - warm) / MOE_LAYERS
    print(f"cold {cold:.3f} s/token, {cold_bytes / 1e6:.1f} MB read; warm {warm:.3f} s/token")
    print(f"per MoE layer: compute <= {per_layer_warm:.3f} s, reads {per_layer_io:.3f} s "
          f"({cold_bytes / MOE_LAYERS / 1e6:.1f} MB)")
    print(f"K3 ({K3_MOE_LAYERS} MoE layers), estimated: warm "
          f"{1 / (K3_MOE_LAYERS * per_layer_warm):.3f} tok/s, cold "
          f"{1 / (K3_MOE_LAYERS * (per_layer_warm + per_layer_io)):.3f} tok/s, "
          f"{K3_MOE_LAYERS * cold_bytes / MOE_LAYERS / 1e9:.1f} GB read per cold token")


if __name__ == "__main__":
    main()
