"""Quantisation benchmark (`make bench-quant`): error and bits/weight per codec, encode throughput.

Data: (a) Gaussian experts, (b) heavy-tailed experts (Student-t, df=4, with a few outlier input
channels shared by all experts of the layer, ×10), (c) the demo model's routed experts and
attention weights when demo/model/model.safetensors exists. Error = relative Frobenius error over
all matrices of a set: sqrt(Σ|Ŵ-W|² / Σ|W|²). Bits/weight include row/group scales and, for rvq,
the codebooks (and rotation signs) amortised over EXPERTS_AMORTISED experts for synthetic data and
over the real expert count for the demo model.

    python -m bench.quant            # default run, writes the table into docs/QUANTIZATION.md
    python -m bench.quant --quick    # smaller, prints only
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from moepack.convert.quant import (
    TRUNK_CODECS,
    TRUNK_DEFAULTS,
    RvqSettings,
    encode,
    expert_settings,
    train_layer,
)
from moepack.format.codecs import codebook_shape, decode, encoded_nbytes

from bench.doc_sections import replace_section
from bench.machine import git_commit, machine_line, utc_now

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "QUANTIZATION.md"
DEMO = ROOT / "demo" / "model" / "model.safetensors"
DEMO_CODECS = ("rvq3-baseline", "rvq3", "rvq3-hadamard", "rvq2", "rvq4")  # ablations: synthetic
GROUP_CODECS = ("q8", "q6", "q4", "q4-zp", "q4-g16", "q4-g64", "q4-zp-g64")  # bits-matched pairs
EXPERTS_AMORTISED = 128  # realistic routed-expert count per layer (DeepSeek-V3: 256, Qwen3: 128)


def ablations() -> dict[str, RvqSettings]:
    """The baseline recipe, one improvement at a time, the presets, and a bigger-training run."""
    base = expert_settings("rvq3-baseline")
    return {
        "rvq3-baseline": base,
        "+rms scale": replace(base, scale="rms"),
        "+refit scale": replace(base, refit_scale=True),
        "+beam 4": replace(base, beam=4),
        "+refine 2": replace(base, refine=2),
        "+hadamard": replace(base, rotation="hadamard"),
        "+iters 25": replace(base, iters=25),
        "rvq3": expert_settings("rvq3"),
        "rvq3-hadamard": expert_settings("rvq3-hadamard"),
        "rvq3 beam 8": replace(expert_settings("rvq3"), beam=8),
        "rvq2": expert_settings("rvq2"),
        "rvq4": expert_settings("rvq4"),
    }


def synthetic(kind: str, count: int, shape: tuple[int, int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return [(rng.standard_normal(shape) * 0.02).astype(np.float32) for _ in range(count)]
    outliers = rng.choice(shape[1], max(2, shape[1] // 128), replace=False)
    col_scale = np.ones(shape[1], np.float32)
    col_scale[outliers] = 10.0
    return [(rng.standard_t(4, shape) * 0.02 * col_scale).astype(np.float32)
            for _ in range(count)]


def demo_sets() -> tuple[dict[str, list[np.ndarray]], list[np.ndarray]]:
    """Demo experts grouped per (layer, projection), and its attention matrices."""
    from safetensors import safe_open

    experts: dict[str, list[np.ndarray]] = {}
    attn: list[np.ndarray] = []
    with safe_open(str(DEMO), framework="pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name).float().numpy()
            if ".experts." in name and name.endswith(".weight"):
                parts = name.split(".")
                layer, proj = parts[2], parts[-2]
                experts.setdefault(f"{layer}.{proj}", []).append(t)
            elif ".self_attn." in name and t.ndim == 2:
                attn.append(t)
    return experts, attn


def rel_err(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    num = sum(float(np.sum((a.astype(np.float64) - b) ** 2)) for a, b in pairs)
    den = sum(float(np.sum(b.astype(np.float64) ** 2)) for _, b in pairs)
    return (num / den) ** 0.5


def run_rvq(groups: list[list[np.ndarray]], st: RvqSettings, amortise: int | None):
    """(error, bits/weight, train CPU s per group, encode weights per CPU s) over the groups
    (one group = the experts of one layer × projection)."""
    pairs, nbytes, weights, t_train, t_enc = [], 0.0, 0, 0.0, 0.0
    for gi, ws in enumerate(groups):
        shape = ws[0].shape
        t0 = time.process_time()
        codec, cb, signs = train_layer(lambda e, ws=ws: ws[e], len(ws), shape, st, seed=gi)
        t_train += time.process_time() - t0
        for w in ws:
            t1 = time.process_time()
            data = encode(codec, w, codebook=cb, rotation=signs, settings=st)
            t_enc += time.process_time() - t1
            pairs.append((decode(codec, shape, data, codebook=cb, rotation=signs), w))
        per = encoded_nbytes(codec, shape)
        cb_bytes = 2 if TRUNK_DEFAULTS["codebook"] == "f16" else 4  # as the converter stores them
        shared = (cb_bytes * np.prod(codebook_shape(codec))
                  + (4 * shape[1] if signs is not None else 0))
        n = amortise or len(ws)
        nbytes += len(ws) * (per + shared / n)
        weights += len(ws) * shape[0] * shape[1]
    return rel_err(pairs), 8 * nbytes / weights, t_train / len(groups), weights / t_enc


def run_group(mats: list[np.ndarray], codec: dict) -> tuple[float, float]:
    pairs = [(decode(codec, w.shape, encode(codec, w)), w) for w in mats]
    bits = 8 * sum(encoded_nbytes(codec, w.shape) for w in mats) / sum(w.size for w in mats)
    return rel_err(pairs), bits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sets, fewer codecs; print only")
    ap.add_argument("--full", action="store_true", help="every ablation on the demo model too")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/QUANTIZATION.md")
    args = ap.parse_args()
    count, shape = (4, (128, 256)) if args.quick else (4, (256, 512))
    sets: dict[str, tuple[list[list[np.ndarray]], int | None]] = {
        "gaussian": ([synthetic("gaussian", count, shape, 1)], EXPERTS_AMORTISED),
        "heavy-tailed": ([synthetic("heavy", count, shape, 2)], EXPERTS_AMORTISED),
    }
    attn: list[np.ndarray] = []
    if DEMO.exists():
        experts, attn = demo_sets()
        sets["demo experts"] = (list(experts.values()), None)
    codecs = ablations()
    if args.quick:
        codecs = {k: codecs[k] for k in ("rvq3-baseline", "rvq3")}
    lines = [f"| codec | {' | '.join(f'{s} err | bits/w' for s in sets)} |",
             "|---|" + "---:|---:|" * len(sets)]
    speed: dict[str, tuple[float, float]] = {}
    for name, st in codecs.items():
        cells = []
        for sname, (groups, amort) in sets.items():
            if sname == "demo experts" and name not in DEMO_CODECS and not args.full:
                cells.append("— | —")
                continue
            err, bits, t_train, rate = run_rvq(groups, st, amort)
            cells.append(f"{100 * err:.2f}% | {bits:.3f}")
            if sname == "gaussian":
                speed[name] = (t_train, rate)
        lines.append(f"| {name} | {' | '.join(cells)} |")
        print(lines[-1], flush=True)
    synth = {k: sum(v[0], []) for k, v in sets.items()}
    for cname in GROUP_CODECS:
        cells = []
        for sname in sets:
            err, bits = run_group(synth[sname], TRUNK_CODECS[cname])
            cells.append(f"{100 * err:.2f}% | {bits:.3f}")
        lines.append(f"| {cname} | {' | '.join(cells)} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    trunk = []
    if attn:
        for cname in GROUP_CODECS:
            err, bits = run_group(attn, TRUNK_CODECS[cname])
            trunk.append(f"| {cname} | {100 * err:.2f}% | {bits:.3f} |")
        print("\n".join(trunk))
    ppl: list[str] = []
    if DEMO.exists() and (DEMO.parent / "config.json").exists() and not args.quick:
        from bench.quant_ppl import heldout_table

        ppl = heldout_table(DEMO.parent, ROOT / "demo" / "heldout.txt")
    rates = "\n".join(f"| {k} | {t:.1f} | {r / 1e6:.2f} M |" for k, (t, r) in speed.items())
    print(rates)
    if args.quick or args.no_write:
        return
    now = utc_now()
    body = [
        f"Measured {now} on {machine_line()}, commit {git_commit()}, by `python -m bench.quant`.",
        f"Synthetic sets: {count} experts of {list(shape)}; bits/weight amortise codebooks over "
        f"{EXPERTS_AMORTISED} experts. Demo: every layer × projection, codebooks over its "
        "8 experts.",
        "", table, "",
    ]
    if trunk:
        body += ["Demo model attention weights (q, k, v, o of all layers):", "",
                 "| codec | rel. error | bits/w |", "|---|---:|---:|", *trunk, ""]
    if ppl:
        body += ["Demo model held-out loss with quantised weights (bench/quant_ppl.py):", "",
                 *ppl, ""]
    body += ["Throughput on the Gaussian set, 1 thread, CPU time (process_time, so other load "
             "on the machine inflates it less than wall time). Training cost is per layer × "
             "projection and independent of the expert count; encoding cost is per weight:", "",
             "| codec | train s / (layer, proj) | encode weights/s |", "|---|---:|---:|", rates]
    replace_section(DOC, "quant", "\n".join(body))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
