"""Encoder throughput per core for every expert preset on full-size expert shapes.

For each shape (DeepSeek-V3/Kimi-K2 experts: hidden 7168 x intermediate 2048; Qwen3-235B: 4096 x
1536) and preset, trains one layer's codebooks per projection (gate, up, down; the preset's
training sample, drawn from `EXPERTS` synthetic heavy-tailed experts) and encodes one expert's
three projections, with one encoder thread. Reports CPU seconds (this process: robust to other
load on a shared machine) and wall seconds, expert weights/s per core, and training CPU-s per
projection. `estimate()` turns these into conversion times for real models.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
from moepack.convert.quant import (
    EXPERT_PRESETS,
    encode,
    expert_settings,
    layer_seed,
    train_layer,
)

SHAPES = {"7168x2048": (7168, 2048), "4096x1536": (4096, 1536)}   # hidden x intermediate
EXPERTS = 4


@dataclass
class Rate:
    preset: str
    shape: str
    encode_cpu_s: float          # one expert (3 projections)
    encode_wall_s: float
    weights_per_s_core: float    # expert weights / encode CPU-s
    train_cpu_s_per_proj: float  # mean over gate, up, down
    train_wall_s_per_proj: float


def _experts(hidden: int, inter: int) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)

    def t(shape: tuple[int, int]) -> np.ndarray:
        return (0.02 * rng.standard_t(5, size=shape)).astype(np.float32)

    return {"gate": [t((inter, hidden)) for _ in range(EXPERTS)],
            "up": [t((inter, hidden)) for _ in range(EXPERTS)],
            "down": [t((hidden, inter)) for _ in range(EXPERTS)]}


def _timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def measure(presets: list[str] | None = None, shapes: list[str] | None = None,
            log: Callable[[str], None] = print) -> list[Rate]:
    rates = []
    for shape_name in shapes or list(SHAPES):
        hidden, inter = SHAPES[shape_name]
        experts = _experts(hidden, inter)
        for preset in presets or list(EXPERT_PRESETS):
            s = expert_settings(preset)
            t_cpu = t_wall = e_cpu = e_wall = 0.0
            for part, ws in experts.items():
                shape = ws[0].shape
                (codec, cb, signs), c, w = _timed(partial(
                    train_layer, ws.__getitem__, EXPERTS, shape, s, layer_seed(0, 0, part),
                    part=part, threads=1))
                t_cpu, t_wall = t_cpu + c, t_wall + w
                _, c, w = _timed(partial(encode, codec, ws[0], codebook=cb, rotation=signs,
                                         settings=s, threads=1))
                e_cpu, e_wall = e_cpu + c, e_wall + w
            n = 3 * hidden * inter
            r = Rate(preset, shape_name, round(e_cpu, 3), round(e_wall, 3),
                     round(n / max(e_cpu, 1e-9)), round(t_cpu / 3, 3), round(t_wall / 3, 3))
            log(str(asdict(r)))
            rates.append(r)
    return rates


# Expert weights and projections to train of the supported real models (from their config.json):
# MoE layers x experts x 3 x hidden x expert intermediate; shape: the measured shape used.
MODELS = {
    "Qwen3-30B-A3B": (48, 128, 2048, 768, "4096x1536"),
    "Mixtral-8x7B": (32, 8, 4096, 14336, "4096x1536"),
    "Mixtral-8x22B": (56, 8, 6144, 16384, "7168x2048"),
    "Qwen3-235B-A22B": (94, 128, 4096, 1536, "4096x1536"),
    "DeepSeek-V3 / R1": (58, 256, 7168, 2048, "7168x2048"),
    "Kimi-K2": (60, 384, 7168, 2048, "7168x2048"),
}


def estimate(rates: list[Rate], preset: str, cores: int) -> dict[str, float]:
    """Hours to convert each model's experts on `cores` cores at the measured rates (training
    included; trunk, reading and writing not: they were a few % of the time in the 2026-11-29
    end-to-end runs). An estimate, not a measurement."""
    by = {(r.preset, r.shape): r for r in rates}
    out = {}
    for model, (layers, experts, hidden, inter, shape) in MODELS.items():
        r = by[(preset, shape)]
        weights = layers * experts * 3 * hidden * inter
        cpu_s = weights / r.weights_per_s_core + layers * 3 * r.train_cpu_s_per_proj
        out[model] = cpu_s / cores / 3600
    return out


def markdown(rates: list[Rate], cores: tuple[int, ...] = (2, 16, 64, 512),
             presets: tuple[str, ...] = ("rvq3-l", "rvq3", "rvq3-baseline")) -> str:
    """The rate table and the estimate table for docs/CONVERT.md."""
    lines = ["| preset | shape | M expert weights/s per core | encode CPU-s per expert | "
             "training CPU-s per projection |", "|---|---|---|---|---|"]
    for r in rates:
        lines.append(f"| `{r.preset}` | {r.shape} | {r.weights_per_s_core / 1e6:.2f} | "
                     f"{r.encode_cpu_s:.2f} | {r.train_cpu_s_per_proj:.2f} |")
    lines += ["", "| model (expert weights) | preset | " + " | ".join(f"{c} cores" for c in cores)
              + " |", "|---|---|" + "---|" * len(cores)]
    for model, (layers, experts, hidden, inter, _) in MODELS.items():
        n = layers * experts * 3 * hidden * inter
        for p in presets:
            hours = [estimate(rates, p, c)[model] for c in cores]
            lines.append(f"| {model} ({n / 1e9:.0f} G) | `{p}` | "
                         + " | ".join(_hours(h) for h in hours) + " |")
    return "\n".join(lines)


def _hours(h: float) -> str:
    if h >= 48:
        return f"{h / 24:.1f} d"
    if h >= 1:
        return f"{h:.1f} h"
    return f"{h * 60:.0f} min" if h * 60 >= 1 else "< 1 min"
