"""Quantisation quality measured against the original model on real text (issue 8).

One container against its source checkpoint:

    python -m bench.quality --container m.moepack --reference demo/model --text demo/heldout.txt \
        [--ctx 256] [--first 128] [--windows N] [--json]

runs the container in the moepack runtime (C engine, teacher-forced) and the original checkpoint
in `transformers` (float32 arithmetic on the stored weights) over the same token ids and prints
the statistics of bench/kl.py: mean / median / p99 KL(original ‖ container), top-1 agreement,
perplexity of each and their ratio.

Windows follow llama.cpp's `llama-perplexity --kl-divergence`: the text is tokenized once
(without special tokens) and cut into consecutive non-overlapping windows of ctx tokens, each
being BOS followed by ctx − 1 text tokens; only positions first … ctx − 2 are scored (each
predicts the next token of the window), so every scored token has at least `first` tokens of
context. Default first = ctx / 2, as llama.cpp.

The whole matrix (every expert preset, trunk settings, llama.cpp's Q3_K_M / Q4_K_M) and
docs/QUALITY.md:

    python -m bench.quality --matrix --reference demo/model --text demo/heldout.txt \
        [--workdir /tmp/moepack-quality] [--doc docs/QUALITY.md] [--no-llama]

Results are kept in WORKDIR/results.json (a rerun skips the rows already there unless --redo);
`--render` rewrites the doc from that file alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import kl
from bench.machine import cpu_simd_flags, git_commit, machine_line, utc_now

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "QUALITY.md"


# ------------------------------------------------------------------------------------ text
@dataclass(frozen=True)
class Windows:
    tokens: np.ndarray   # int64 [W, ctx]: BOS + ctx-1 text tokens each
    first: int           # first scored position
    text_tokens: int     # tokens of the whole text

    @property
    def ctx(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def targets(self) -> np.ndarray:  # [W, ctx-1-first]: token that follows each scored position
        return self.tokens[:, self.first + 1:]

    @property
    def positions(self) -> int:
        return int(self.targets.size)


def bos_id(src_dir: Path) -> int:
    cfg = json.loads((Path(src_dir) / "config.json").read_text())
    bos = cfg.get("bos_token_id")
    if isinstance(bos, list):
        bos = bos[0]
    if bos is None:
        raise SystemExit(f"{src_dir}/config.json has no bos_token_id")
    return int(bos)


def tokenize(src_dir: Path, text: str) -> list[int]:
    """Token ids of `text` by the checkpoint's tokenizer.json, no special tokens added."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(src_dir) / "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


def make_windows(ids: list[int], bos: int, ctx: int, first: int | None = None,
                 max_windows: int | None = None) -> Windows:
    """Consecutive windows [BOS, t_i … t_{i+ctx-2}] over `ids` (a partial last one is dropped)."""
    if ctx < 4:
        raise ValueError("ctx must be at least 4")
    first = ctx // 2 if first is None else first
    if not 0 <= first <= ctx - 2:
        raise ValueError(f"first must be in 0..{ctx - 2}")
    step = ctx - 1
    n = len(ids) // step
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        raise ValueError(f"text has {len(ids)} tokens, fewer than one window of {ctx}")
    body = np.asarray(ids[: n * step], dtype=np.int64).reshape(n, step)
    toks = np.concatenate([np.full((n, 1), bos, dtype=np.int64), body], axis=1)
    return Windows(toks, first, len(ids))


def load_windows(src_dir: Path, text_path: Path, ctx: int, first: int | None,
                 max_windows: int | None) -> Windows:
    ids = tokenize(src_dir, Path(text_path).read_text(encoding="utf-8"))
    return make_windows(ids, bos_id(src_dir), ctx, first, max_windows)


# ------------------------------------------------------------------------------------ models
def reference_logits(src_dir: Path, win: Windows, batch: int = 4,
                     threads: int | None = None) -> np.ndarray:
    """float32 [W, ctx-1-first, vocab]: the original checkpoint in transformers, float32 math."""
    import torch
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(win.tokens), batch):
            t = torch.from_numpy(win.tokens[i:i + batch])
            lg = model(t, use_cache=False).logits[:, win.first:win.ctx - 1]
            out.append(lg.float().numpy())
    return np.concatenate(out)


def container_logits(path: Path, win: Windows, threads: int | None = None,
                     kv: str | None = None) -> np.ndarray:
    """float32 [W, ctx-1-first, vocab]: the container in the moepack engine (all in RAM); kv:
    the KV entry type (None: the engine's default)."""
    from moepack.runtime.engine import Engine

    out = []
    with Engine(str(path), threads=threads, ctx=win.ctx, kv=kv) as eng:
        for row in win.tokens:
            out.append(eng.logits(row.tolist())[win.first:win.ctx - 1])
    return np.stack(out)


def statistics(ref: np.ndarray, q: np.ndarray, win: Windows) -> dict:
    parts = [kl.position_stats(ref[i], q[i], win.targets[i]) for i in range(len(ref))]
    return kl.summarize(kl.concat(parts))


def container_size(path: Path) -> dict:
    from moepack.format.info import container_info
    from moepack.format.reader import Container

    with Container.open(path) as c:
        info = container_info(c)
        blobs = sum(s["length"] for s in c.sections if s["type"] == "blob")
    w = info["bytes"]
    weight_bytes = w["trunk"] + w["experts"] + w["codebooks"]
    return {
        "file_size": info["file_size"],
        "weight_bytes": weight_bytes,
        "blob_bytes": blobs,
        "parameters": info["parameters"]["total"],
        "bpw": info["bits_per_weight"]["overall"],
        "bpw_experts": info["bits_per_weight"]["experts"],
        "bpw_experts_payload": info["bits_per_weight"]["experts_payload"],
        "bpw_trunk": info["bits_per_weight"]["trunk"],
        "codecs": {k: v.get("name") + (f"/g{v['group_size']}" if "group_size" in v else "")
                   + ("+zp" if v.get("zero_point") else "")
                   + (f"x{v['stages']}" if "stages" in v else "")
                   for k, v in info["codecs"].items()},
    }


# ------------------------------------------------------------------------------------ one
def evaluate(container: Path, reference: Path, text: Path, ctx: int = 256,
             first: int | None = None, max_windows: int | None = None,
             threads: int | None = None) -> dict:
    win = load_windows(reference, text, ctx, first, max_windows)
    t0 = time.monotonic()
    ref = reference_logits(reference, win, threads=threads)
    t1 = time.monotonic()
    q = container_logits(container, win, threads=threads)
    t2 = time.monotonic()
    res = statistics(ref, q, win)
    res.update(container_size(container))
    res.update(ctx=win.ctx, first=win.first, windows=len(win.tokens), text_tokens=win.text_tokens,
               seconds_reference=round(t1 - t0, 2), seconds_container=round(t2 - t1, 2))
    return res


FMT_HEAD = ("| setting | file MB | weights bpw | experts bpw | mean KL ± se | median KL | p99 KL "
            "| top-1 % | PPL orig | PPL quant | PPL ratio |")
FMT_RULE = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def fmt_kl(v: float) -> str:
    """4 decimals, or 2 significant digits below 0.001 (so ~0 does not read as 0.0000)."""
    return f"{v:.4f}" if v >= 1e-3 or v == 0 else f"{v:.1e}"


def fmt_row(name: str, r: dict) -> str:
    def g(k, f):
        v = r.get(k)
        return "—" if v is None else format(v, f)

    file_mb = "—" if r.get("file_size") is None else f"{r['file_size'] / 1e6:.2f}"
    return (f"| {name} | {file_mb} | {g('bpw', '.2f')} | {g('bpw_experts', '.2f')} "
            f"| {fmt_kl(r['kl_mean'])} ± {fmt_kl(r['kl_mean_se'])} | {fmt_kl(r['kl_median'])} "
            f"| {fmt_kl(r['kl_p99'])} | {100 * r['top1']:.2f} | {r['ppl_ref']:.3f} "
            f"| {r['ppl_q']:.3f} | {r['ppl_ratio']:.4f} |")


# ------------------------------------------------------------------------------------ matrix
@dataclass(frozen=True)
class Setting:
    name: str
    preset: str                                # expert preset (--expert-codec)
    trunk: tuple[tuple[str, str], ...] = ()    # Settings.trunk overrides
    group: str = "experts"                     # table in the doc
    seed: int = 0


QUANTISED_TRUNK = ("attn", "embed", "lm_head", "shared_expert", "dense_ffn")
DEFAULT_ROW = "rvq3-l (default)"
SETTINGS: list[Setting] = [
    Setting(DEFAULT_ROW, "rvq3-l"),
    Setting("rvq3-m", "rvq3-m"),
    Setting("rvq3", "rvq3"),
    Setting("rvq3-baseline", "rvq3-baseline"),
    Setting("rvq3-hadamard", "rvq3-hadamard"),
    Setting("rvq2", "rvq2"),
    Setting("rvq4", "rvq4"),
    # k-means starts from seeded samples: the spread over seeds says which differences are real
    Setting("rvq3-l, seed 1", "rvq3-l", group="seeds", seed=1),
    Setting("rvq3-l, seed 2", "rvq3-l", group="seeds", seed=2),
    Setting("rvq3-l, trunk f32 (experts' error alone)", "rvq3-l",
            tuple((c, "f32") for c in (*QUANTISED_TRUNK, "codebook")), "trunk"),
    Setting("rvq3-l, embed + lm_head q8", "rvq3-l", (("embed", "q8"), ("lm_head", "q8")),
            "trunk"),
    Setting("rvq3-l, attn q8", "rvq3-l", (("attn", "q8"),), "trunk"),
    Setting("rvq3-l, attn q4", "rvq3-l", (("attn", "q4"),), "trunk"),
    Setting("rvq3-l, all trunk q4 (`--trunk-codec q4`)", "rvq3-l",
            tuple((c, "q4") for c in QUANTISED_TRUNK), "trunk"),
    Setting("rvq3-l, codebooks f32", "rvq3-l", (("codebook", "f32"),), "trunk"),
    # the previous defaults (all trunk q8, f32 codebooks) with 3 and 3-or-4 stages
    Setting("rvq3, trunk q8, codebooks f32", "rvq3",
            tuple((c, "q8") for c in QUANTISED_TRUNK) + (("codebook", "f32"),), "size"),
    Setting("rvq3-m, embed + lm_head q8", "rvq3-m", (("embed", "q8"), ("lm_head", "q8")),
            "size"),
]


def ordered(rows: dict) -> list[tuple[str, dict]]:
    """Rows in SETTINGS order (results.json is saved with sorted keys), others after them."""
    rank = {st.name: i for i, st in enumerate(SETTINGS)}
    return sorted(rows.items(), key=lambda kv: rank.get(kv[0], len(rank)))


SANITY = "engine vs transformers on the default container's own f32 export (sanity)"


def sanity_row(container: Path, work: Path, win: Windows, q: np.ndarray,
               threads: int | None) -> dict:
    """The engine's logits against transformers running `moepack export` of the same container:
    the same weights, so any KL left is the runtime's arithmetic, not quantisation."""
    import shutil

    from moepack.convert.export import export

    hf = work / "export-default"
    shutil.rmtree(hf, ignore_errors=True)
    export(container, hf)
    ref = reference_logits(hf, win, threads=threads)
    shutil.rmtree(hf, ignore_errors=True)
    row = statistics(ref, q, win)
    row.update(container_size(container), group="sanity")
    return row


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")[:60]


def _convert(src: Path, out: Path, preset: str, trunk, seed: int = 0) -> float:
    from moepack.convert.pipeline import convert
    from moepack.convert.progress import Reporter
    from moepack.convert.settings import Settings

    t0 = time.monotonic()
    settings = Settings(expert_preset=preset, trunk=tuple(sorted(trunk)), seed=seed)
    convert(src, out, settings, jobs=1, force=True, restart=True, reporter=Reporter())
    return time.monotonic() - t0


def environment() -> dict:
    versions = {}
    for mod in ("torch", "transformers", "numpy", "llama_cpp"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: say so
            versions[mod] = "not installed"
    return {"date": utc_now(), "commit": git_commit(),
            "cpu": f"{machine_line()}, flags {' '.join(cpu_simd_flags()) or 'none'}",
            "python": platform.python_version(), "versions": versions}


def describe_model(src: Path) -> dict:
    cfg = json.loads((Path(src) / "config.json").read_text())
    import hashlib

    from safetensors import safe_open

    params, dtypes, digest = 0, set(), hashlib.sha256()
    for f in sorted(Path(src).glob("*.safetensors")):
        digest.update(f.read_bytes())
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                t = st.get_slice(k)
                params += int(np.prod(t.get_shape()))
                dtypes.add(str(t.get_dtype()))
    return {"dir": str(src), "architecture": (cfg.get("architectures") or ["?"])[0],
            "layers": cfg.get("num_hidden_layers"), "experts": cfg.get("num_local_experts"),
            "top_k": cfg.get("num_experts_per_tok"), "hidden": cfg.get("hidden_size"),
            "intermediate": cfg.get("intermediate_size"), "vocab": cfg.get("vocab_size"),
            "parameters": params, "dtypes": sorted(dtypes),
            "sha256": digest.hexdigest()[:16]}


def _save(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def matrix(args, row_extra: Callable[[Path, Windows], dict] | None = None) -> dict:
    """row_extra(container, windows): more statistics for each row, before the container
    is deleted (bench/dsa_twin.py's selection changes)."""
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    res_path = work / "results.json"
    data = json.loads(res_path.read_text()) if res_path.exists() and not args.redo else {}
    data.setdefault("rows", {})
    src, text = Path(args.reference), Path(args.text)
    win = load_windows(src, text, args.ctx, args.first, args.windows)
    data["text"] = {"file": str(text), "bytes": text.stat().st_size,
                    "text_tokens": win.text_tokens, "windows": len(win.tokens), "ctx": win.ctx,
                    "first": win.first, "positions": win.positions}
    env = environment()
    if "env" in data:  # rows from an earlier run are kept: say when the last one was added
        data["env"]["finished"] = env["date"]
    else:
        data["env"] = env
    data["model"] = describe_model(src)
    ref_path = work / f"ref_logits_ctx{win.ctx}_f{win.first}_w{len(win.tokens)}.npy"
    if ref_path.exists():
        ref = np.load(ref_path, mmap_mode="r")
    else:
        t0 = time.monotonic()
        ref = reference_logits(src, win, threads=args.threads)
        np.save(ref_path, ref)
        print(f"reference logits {ref.shape} in {time.monotonic() - t0:.0f} s", flush=True)
    for st in SETTINGS:
        name = st.name
        if args.only and not any(o in name for o in args.only):
            continue
        if name in data["rows"]:
            continue
        out = work / f"{_slug(name)}.moepack"
        secs = _convert(src, out, st.preset, st.trunk, st.seed)
        t0 = time.monotonic()
        q = container_logits(out, win, threads=args.threads)
        row = statistics(ref, q, win)
        row.update(container_size(out), group=st.group, convert_seconds=round(secs, 1),
                   eval_seconds=round(time.monotonic() - t0, 1))
        if row_extra is not None:
            row.update(row_extra(out, win))
        data["rows"][name] = row
        print(fmt_row(name, row), flush=True)
        _save(res_path, data)
        if name == DEFAULT_ROW and SANITY not in data["rows"]:
            data["rows"][SANITY] = sanity_row(out, work, win, q, args.threads)
            print(fmt_row(SANITY, data["rows"][SANITY]), flush=True)
            _save(res_path, data)
        out.unlink(missing_ok=True)
    if "finished" in data["env"]:
        data["env"]["finished"] = environment()["date"]
    if args.llama and "llama" not in data:
        from bench import llama_quality

        data["llama"] = llama_quality.run(src, win, ref, work, threads=args.threads)
        _save(res_path, data)
    _save(res_path, data)
    return data


# ------------------------------------------------------------------------------------ doc
def render(data: dict) -> str:
    env, txt, rows, m = data["env"], data["text"], data["rows"], data["model"]
    lines = [
        "# Quantisation quality against the original model",
        "",
        "Generated by `python -m bench.quality --matrix` (bench/quality.py, statistics in",
        "bench/kl.py, llama.cpp side in bench/llama_quality.py); do not edit the tables by hand.",
        "",
        f"- **Date**: {env['date']}"
        + (f" to {env['finished']}" if env.get("finished") else "")
        + f"; **commit**: {env['commit']}",
        f"- **Hardware**: {env['cpu']} (shared with other jobs; timings are not benchmarks)",
        f"- **Software**: Python {env['python']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"- **Model**: `{m['dir']}` ({m['architecture']}: {m['layers']} layers, {m['experts']} "
        f"experts, top-{m['top_k']}, hidden {m['hidden']}, expert FFN {m['intermediate']}, "
        f"vocabulary {m['vocab']}; {m['parameters']:,} parameters stored as "
        f"{'/'.join(m['dtypes'])}; safetensors sha256 {m.get('sha256', '?')}…), run by "
        "transformers in float32 arithmetic: the "
        "**original**.",
        f"- **Text**: `{txt['file']}` ({txt['bytes']:,} bytes, {txt['text_tokens']:,} tokens, "
        "held out from training), tokenized by the demo tokenizer; "
        f"{txt['windows']} windows of {txt['ctx']} tokens (BOS + {txt['ctx'] - 1} text tokens), "
        f"positions {txt['first']}…{txt['ctx'] - 2} of each scored: "
        f"**{txt['positions']:,} positions**.",
        "",
        "Statistics (llama.cpp `--kl-divergence` methodology): KL(original ‖ quantised) of the",
        "next-token distributions in nats, computed in float64 from full-vocabulary logits;",
        "top-1 = share of positions where both models' most likely next token agree; PPL =",
        "exp(mean negative log-likelihood of the actual next token); ratio = PPL quant / PPL",
        "orig. ± is one standard error of the mean over positions (positions are correlated",
        "within a window, so it is a lower bound). *weights bpw* = 8 × (trunk + expert +",
        "codebook bytes) / parameters; *experts bpw* = expert bytes (records incl. row scales",
        "and alignment padding) / expert parameters. *file MB* includes the tokenizer blobs",
        "and the index.",
        "",
    ]

    def table(group: str) -> list[str]:
        out = [FMT_HEAD, FMT_RULE]
        for name, r in ordered(rows):
            if r.get("group") == group:
                out.append(fmt_row(name, r))
        return out

    lines += ["## moepack: expert codec presets (default trunk: q6 attention, embedding and LM "
              "head; f16 codebooks; f32 norms and router)", ""]
    lines += table("experts")
    if any(r.get("group") == "seeds" for r in rows.values()):
        lines += ["", "## moepack: the default with other k-means seeds (`--seed`)", ""]
        lines += table("seeds")
    lines += ["", "## moepack: trunk settings (experts rvq3-l)", ""]
    lines += table("trunk")
    if any(r.get("group") == "size" for r in rows.values()):
        lines += ["", "## moepack: other byte splits", ""]
        lines += table("size")
    lines += ["", "## Sanity check of the runtime", "",
              "The engine against transformers on the *same* (dequantised) weights: what is left",
              "is the runtime's arithmetic, so the KL above is quantisation error.", ""]
    lines += table("sanity")
    lines += [""]
    lines += render_llama(data.get("llama"), rows)
    return "\n".join(lines) + "\n"


def render_llama(ll: dict | None, rows: dict) -> list[str]:
    lines = ["## llama.cpp on the same model and token ids", ""]
    if not ll:
        return lines + ["Not measured (run with llama-cpp-python installed)."]
    if ll.get("error"):
        lines += [f"**Not measured**: {ll['error']}", ""]
        if not ll.get("rows"):
            return lines
    lines += ll.get("notes", []) + [""]
    lines += [FMT_HEAD.replace("experts bpw", "expert tensors bpw"), FMT_RULE]
    for name, r in ll.get("rows", {}).items():
        lines.append(fmt_row(name, r))
    lines += ["", "## Side by side: does the default beat Q3_K_M?", ""]
    d = rows.get(DEFAULT_ROW)
    q3 = ll.get("rows", {}).get("Q3_K_M vs llama.cpp F32")
    q4 = ll.get("rows", {}).get("Q4_K_M vs llama.cpp F32")
    if d and q3:
        lines += [FMT_HEAD, FMT_RULE, fmt_row(f"moepack {DEFAULT_ROW} vs original", d),
                  fmt_row("llama.cpp Q3_K_M vs its F32", q3)]
        if q4:
            lines.append(fmt_row("llama.cpp Q4_K_M vs its F32", q4))
        lines += [""] + verdict(d, q3, q4)
    return lines


def verdict(d: dict, q3: dict, q4: dict | None) -> list[str]:
    def sig(a, b):  # a < b by more than 2 standard errors (combined)
        se = math.hypot(a["kl_mean_se"], b["kl_mean_se"])
        return a["kl_mean"] + 2 * se < b["kl_mean"]

    better_kl = d["kl_mean"] < q3["kl_mean"]
    better_top1 = d["top1"] > q3["top1"]
    smaller_file = d["file_size"] < q3["file_size"]
    smaller_w = d["weight_bytes"] < q3["weight_bytes"]
    out = [
        f"- Mean KL: default {fmt_kl(d['kl_mean'])} vs Q3_K_M {fmt_kl(q3['kl_mean'])} → "
        + ("**lower**" if better_kl else "**higher**")
        + (" (by more than 2 s.e.)" if sig(d, q3) or sig(q3, d) else " (within 2 s.e.)") + ".",
        f"- Top-1 agreement: {100 * d['top1']:.2f} % vs {100 * q3['top1']:.2f} %.",
        f"- File: {d['file_size'] / 1e6:.2f} MB vs {q3['file_size'] / 1e6:.2f} MB → "
        + ("smaller" if smaller_file else "**larger**") + "; weights alone "
        f"{d['weight_bytes'] / 1e6:.2f} MB vs {q3['weight_bytes'] / 1e6:.2f} MB → "
        + ("smaller" if smaller_w else "**larger**") + ".",
        "- Goal (track the original better than Q3_K_M tracks its F32, with a smaller file): **"
        + ("met" if better_kl and better_top1 and smaller_file else "not met") + "**.",
    ]
    if q4:
        out.append("- Moonshot (Q4_K_M quality at 3 bits): mean KL "
                   f"{fmt_kl(d['kl_mean'])} vs Q4_K_M {fmt_kl(q4['kl_mean'])} → **"
                   + ("met" if d["kl_mean"] <= q4["kl_mean"] else "not met") + "**.")
    return out


END = "<!-- quality:end (text below this line is kept by reruns) -->"


def write_doc(data: dict, doc: Path) -> None:
    tail = ""
    if doc.exists() and END in doc.read_text():
        tail = doc.read_text().split(END, 1)[1]
    doc.write_text(render(data) + "\n" + END + (tail or "\n"))
    print(f"wrote {doc}")


SUMMARY = ("<!-- quality-summary:begin (bench/quality.py) -->", "<!-- quality-summary:end -->")
QUANT_DOC = ROOT / "docs" / "QUANTIZATION.md"


def render_summary(data: dict) -> str:
    """The short form for docs/QUANTIZATION.md: every moepack row and llama.cpp's two quants."""
    env = data["env"]
    lines = [f"Measured {env['date']}, commit {env['commit']}, {env['cpu']}, by "
             "`python -m bench.quality --matrix` (details, method and caveats: QUALITY.md). Demo "
             "model against the original on held-out text:", "",
             "| setting | file MB | experts bpw | mean KL | top-1 % | PPL ratio |",
             "|---|---:|---:|---:|---:|---:|"]

    def row(name: str, r: dict) -> str:
        return (f"| {name} | {r['file_size'] / 1e6:.2f} | {r['bpw_experts']:.2f} "
                f"| {fmt_kl(r['kl_mean'])} | {100 * r['top1']:.2f} | {r['ppl_ratio']:.4f} |")

    lines += [row(n, r) for n, r in ordered(data["rows"]) if r.get("group") != "sanity"]
    for name in ("Q3_K_M vs llama.cpp F32", "Q4_K_M vs llama.cpp F32"):
        r = (data.get("llama") or {}).get("rows", {}).get(name)
        if r:
            lines.append(row(f"llama.cpp {name}", r))
    return "\n".join(lines)


def write_summary(data: dict, doc: Path = QUANT_DOC) -> None:
    """Rewrites the block between the SUMMARY markers of `doc` (left alone without them)."""
    text = doc.read_text() if doc.exists() else ""
    if SUMMARY[0] not in text or SUMMARY[1] not in text:
        print(f"{doc}: no {SUMMARY[0]} marker, summary not written")
        return
    head, rest = text.split(SUMMARY[0], 1)
    doc.write_text(head + SUMMARY[0] + "\n" + render_summary(data) + "\n" + SUMMARY[1]
                   + rest.split(SUMMARY[1], 1)[1])
    print(f"wrote {doc}")


# ------------------------------------------------------------------------------------ cli
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    ap.add_argument("--container", type=Path, help="container to evaluate")
    ap.add_argument("--reference", type=Path,
                    help="the original Hugging Face checkpoint directory")
    ap.add_argument("--text", type=Path, help="held-out text (UTF-8)")
    ap.add_argument("--ctx", type=int, default=256, help="window length in tokens (incl. BOS)")
    ap.add_argument("--first", type=int, default=None, help="first scored position (ctx/2)")
    ap.add_argument("--windows", type=int, default=None, help="at most this many windows")
    ap.add_argument("--threads", type=int, default=None, help="threads (engine and torch)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--matrix", action="store_true", help="run every setting, write the doc")
    ap.add_argument("--render", action="store_true", help="only rewrite the doc from results")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/moepack-quality"))
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--summary-doc", type=Path, default=None,
                    help="doc whose quality-summary block is rewritten too (default: "
                         "docs/QUANTIZATION.md when --doc is the default)")
    ap.add_argument("--no-llama", dest="llama", action="store_false")
    ap.add_argument("--only", nargs="*", help="matrix rows whose name contains one of these")
    ap.add_argument("--redo", action="store_true", help="ignore earlier results.json")
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads((args.workdir / "results.json").read_text())
        write_doc(data, args.doc)
        if args.summary_doc or args.doc == DOC:
            write_summary(data, args.summary_doc or QUANT_DOC)
        return 0
    if not (args.reference and args.text):
        ap.error("--reference and --text are required")
    if args.matrix:
        data = matrix(args)
        write_doc(data, args.doc)
        if args.summary_doc or args.doc == DOC:
            write_summary(data, args.summary_doc or QUANT_DOC)
        return 0
    if not args.container:
        ap.error("--container is required (or --matrix)")
    r = evaluate(args.container, args.reference, args.text, args.ctx, args.first, args.windows,
                 args.threads)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"{r['windows']} windows × ctx {r['ctx']}, {r['positions']} positions scored "
              f"(from position {r['first']})")
        print(FMT_HEAD)
        print(FMT_RULE)
        print(fmt_row(args.container.name, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
