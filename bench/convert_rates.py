"""Encoder throughput per core for every expert preset on full-size expert shapes.

For each shape (DeepSeek-V3/Kimi-K2 experts: hidden 7168 x intermediate 2048; Qwen3-235B: 4096 x
1536) and preset, trains one layer's codebooks per projection (gate, up, down; the preset's
training sample, drawn from `EXPERTS` synthetic heavy-tailed experts) and encodes one expert's
three projections, with one encoder thread. Reports CPU seconds (this process: robust to other
load on a shared machine) and wall seconds, expert weights/s per core, and training CPU-s per
projection. `estimate()` turns these into conversion times for the real models of docs/configs,
their expert banks as the converter's planner lays them out; `section()` is the generated part
of docs/CONVERT.md, from the rates recorded in bench/results/convert.json:

    .venv/bin/python -m bench.convert_rates            # print it
    .venv/bin/python -m bench.convert_rates --write    # put it into docs/CONVERT.md
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from math import prod
from pathlib import Path
from types import ModuleType

import numpy as np
from moepack.convert.cluster import experts_per_task
from moepack.convert.plan import plan_for_config
from moepack.convert.quant import (
    EXPERT_PRESETS,
    encode,
    expert_settings,
    layer_seed,
    train_layer,
)
from moepack.convert.settings import Settings

from bench.doc_sections import replace_section

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "docs" / "configs"
RESULTS = ROOT / "bench" / "results" / "convert.json"
DOC = ROOT / "docs" / "CONVERT.md"
CORES = (2, 16, 64, 512)
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


def supported_models() -> ModuleType:
    """docs/configs/supported_models.py (a script beside the configs, not a package): its
    MODELS maps each config's file stem to the published names it stands for."""
    spec = importlib.util.spec_from_file_location("supported_models",
                                                  CONFIGS / "supported_models.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class Work:
    """A model's routed experts as the planner lays them out at the default codecs."""

    hidden: int           # input width of gate/up (K3: its 3584-wide latent)
    inter: int            # expert intermediate
    banks: int            # expert banks converted (MTP layers' included)
    experts: int          # per bank
    expert_weights: int   # one expert's three projections
    per_task: int         # experts one --ray expert task encodes

    @property
    def weights(self) -> int:
        return self.banks * self.experts * self.expert_weights


def work_of(config: dict) -> Work:
    layout = plan_for_config(config, Settings())
    banks = layout.spec.banks
    parts = {tuple(p.shape for p in b.parts) for b in banks}
    if len(parts) != 1:
        raise ValueError(f"expert banks of more than one shape: {sorted(parts)}")
    gate = banks[0].parts[0].shape  # [intermediate, hidden]
    return Work(gate[1], gate[0], len(banks), banks[0].count,
                sum(prod(p.shape) for p in banks[0].parts),
                experts_per_task(layout.bank(banks[0].layer).stride))


@functools.cache  # the configs do not change while a process runs
def model_work() -> dict[str, Work]:
    """Published name -> expert work, for every config in docs/configs."""
    names = supported_models().MODELS
    return {names[stem]: work_of(json.loads((CONFIGS / f"{stem}.json").read_text()))
            for stem in names}


def rate_for(rates: list[Rate], preset: str, work: Work) -> Rate:
    """The rate measured at the model's expert shape, or else at the measured shape nearest in
    weights per projection (the RVQ cost is per 8-weight vector: per-weight rates moved 4-14 %
    between the two measured shapes)."""
    measured = [r for r in rates if r.preset == preset]
    if not measured:
        raise ValueError(f"no rate measured for preset {preset!r}")
    for r in measured:
        if SHAPES.get(r.shape) == (work.hidden, work.inter):
            return r
    return min(measured, key=lambda r: abs(math.log(prod(SHAPES[r.shape])
                                                     / (work.hidden * work.inter))))


def hours(work: Work, r: Rate, cores: int) -> float:
    """Estimated hours to encode a model's experts on `cores` cores, training included, split
    as `--ray` splits it: no faster than its longest task chain (a layer's codebook training,
    then one task's chunk of experts). Trunk, reading and writing are not included."""
    cpu_s = work.weights / r.weights_per_s_core + work.banks * 3 * r.train_cpu_s_per_proj
    chain_s = r.train_cpu_s_per_proj + work.per_task * work.expert_weights / r.weights_per_s_core
    return max(cpu_s / cores, chain_s) / 3600


def estimate(rates: list[Rate], preset: str, cores: int) -> dict[str, float]:
    """Hours per real model (docs/configs) on `cores` cores at the measured rates. An
    estimate, not a measurement."""
    return {name: hours(w, rate_for(rates, preset, w), cores)
            for name, w in model_work().items()}


def rate_table(rates: list[Rate]) -> str:
    lines = ["| preset | shape | M expert weights/s per core | encode CPU-s per expert | "
             "training CPU-s per projection |", "|---|---|---|---|---|"]
    for r in rates:
        lines.append(f"| `{r.preset}` | {r.shape} | {r.weights_per_s_core / 1e6:.2f} | "
                     f"{r.encode_cpu_s:.2f} | {r.train_cpu_s_per_proj:.2f} |")
    return "\n".join(lines)


def estimate_table(rates: list[Rate], preset: str, cores: tuple[int, ...] = CORES) -> str:
    """One row per config in docs/configs: its experts, the rate used, hours by core count."""
    lines = ["| model | expert weights | MoE layers × experts | expert shape: rate used | "
             + " | ".join(f"{c} cores" for c in cores) + " | longest task chain |",
             "|---|---|---|---|" + "---|" * (len(cores) + 1)]
    for name, w in model_work().items():
        r = rate_for(rates, preset, w)
        shape = f"{w.hidden}x{w.inter}"
        used = "measured" if r.shape == shape else f"not measured, {r.shape}'s"
        lines.append(f"| {name} | {w.weights / 1e9:.0f} G | {w.banks} × {w.experts} | "
                     f"{shape}: {used}, {r.weights_per_s_core / 1e6:.2f} M/s | "
                     + " | ".join(format_hours(hours(w, r, c)) for c in cores)
                     + f" | {format_hours(hours(w, r, 1 << 40))} |")
    return "\n".join(lines)


def recorded(path: Path = RESULTS) -> tuple[list[Rate], dict]:
    """The rates bench/convert.py recorded, and where and when they were measured."""
    doc = json.loads(path.read_text())
    run = doc.get("rates_run") or doc  # the rates of an earlier run, kept with a later report
    meta = {k: run.get(k, doc.get(k)) for k in ("date", "commit", "cpu", "cores")}
    return [Rate(**r) for r in run["rates"]], meta


def section(path: Path = RESULTS) -> str:
    """docs/CONVERT.md's generated rates and estimates (its bench-convert-rates section)."""
    rates, m = recorded(path)
    preset = Settings().expert_preset
    return (f"Measured {m['date']} at commit {m['commit']} on a {m['cores']}-core {m['cpu']} VM "
            "(`bench/results/convert.json`); CPU seconds of the process, one encoder thread.\n\n"
            f"{rate_table(rates)}\n\n"
            f"**Estimated** hours to convert the expert banks at the default preset `{preset}`, "
            "derived from the rates above, not measured on these models: every config in "
            "docs/configs as the converter's planner lays it out (multi-token-prediction layers "
            "included), at the rate of its expert shape (hidden × intermediate) or, where that "
            "shape was not measured, of the measured shape nearest in weights per projection. "
            "`python -m bench.convert_rates` prints this section.\n\n"
            f"{estimate_table(rates, preset)}")


def format_hours(h: float) -> str:
    if h >= 48:
        return f"{h / 24:.1f} d"
    if h >= 1:
        return f"{h:.1f} h"
    return f"{h * 60:.0f} min" if h * 60 >= 1 else "< 1 min"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="docs/CONVERT.md's rates and estimates section")
    ap.add_argument("--write", action="store_true", help="put it into docs/CONVERT.md")
    if ap.parse_args().write:
        replace_section(DOC, "convert-rates", section())
    else:
        print(section())
