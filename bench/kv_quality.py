"""KL cost of the f16 KV cache (issue 15): the same container run with f32 and with f16 KV entries.

    python -m bench.kv_quality [--container m.moepack] [--reference demo/model]
        [--text demo/heldout.txt] [--ctx 256] [--windows N] [--json]
    python -m bench.kv_quality --tiny deepseek_v3 [--ctx 256] [--windows N] [--json]

Demo mode (the default): the demo checkpoint is converted with the default settings (unless
--container names one) and scored on held-out text in bench/quality.py's windows; it prints
KL(f32 KV ‖ f16 KV), the cost of f16 alone, and KL(original ‖ engine) with each KV type.

--tiny ARCH: a random checkpoint of that architecture (tests/tiny_models.py, widened so that
attention has real work: MLA for deepseek_v3, partial RoPE for glm4_moe) on random token ids;
only KL(f32 KV ‖ f16 KV), since random weights have no text to score.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.quality import Windows, load_windows, make_windows, reference_logits, statistics

ROOT = Path(__file__).resolve().parent.parent
# widened tiny shapes: several KV heads or a real latent, 256+ positions of context
TINY = {
    "deepseek_v3": dict(hidden_size=128, num_attention_heads=8, kv_lora_rank=64,
                        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                        q_lora_rank=48, max_position_embeddings=1024),
    "glm4_moe": dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                     max_position_embeddings=1024),
    "mixtral": dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                    max_position_embeddings=1024),
}


def engine_logits(path: Path, win: Windows, kv: str, threads: int | None) -> np.ndarray:
    """float32 [W, scored positions, vocab] with KV entries of type kv."""
    from moepack.runtime.engine import Engine

    with Engine(str(path), threads=threads, ctx=win.ctx, kv=kv) as eng:
        return np.stack([eng.logits(row.tolist())[win.first:win.ctx - 1] for row in win.tokens])


def convert_default(src: Path, out: Path) -> Path:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    if not out.exists():
        convert(src, out, Settings(), jobs=1)
    return out


def tiny_container(arch: str, work: Path) -> tuple[Path, int]:
    """A converted random checkpoint of `arch` and its vocabulary size."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import make_checkpoint

    src = work / f"{arch}-src"
    make_checkpoint(arch, src, **TINY.get(arch, {}))
    vocab = json.loads((src / "config.json").read_text()).get("vocab_size")
    if vocab is None:  # text_config layouts
        vocab = json.loads((src / "config.json").read_text())["text_config"]["vocab_size"]
    return convert_default(src, work / f"{arch}.moepack"), int(vocab)


def measure(args: argparse.Namespace, work: Path) -> dict:
    res: dict = {"ctx": args.ctx}
    if args.tiny:
        path, vocab = tiny_container(args.tiny, work)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, vocab, (args.windows or 8) * (args.ctx - 1)).tolist()
        win = make_windows(ids, 0, args.ctx, None, args.windows or 8)
        res["model"] = f"random tiny {args.tiny} ({TINY.get(args.tiny, {})})"
    else:
        path = args.container or convert_default(args.reference,
                                                 work / f"{args.reference.name}.moepack")
        win = load_windows(args.reference, args.text, args.ctx, None, args.windows)
        res["model"] = str(args.reference)
    t0 = time.monotonic()
    f32 = engine_logits(path, win, "f32", args.threads)
    f16 = engine_logits(path, win, "f16", args.threads)
    res["f16_vs_f32"] = statistics(f32, f16, win)
    if not args.tiny:
        ref = reference_logits(args.reference, win, threads=args.threads)
        res["orig_vs_f32"] = statistics(ref, f32, win)
        res["orig_vs_f16"] = statistics(ref, f16, win)
    res.update(windows=len(win.tokens), positions=win.positions,
               seconds=round(time.monotonic() - t0, 1))
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--container", type=Path, help="container to run (default: convert the demo)")
    ap.add_argument("--reference", type=Path, default=ROOT / "demo" / "model")
    ap.add_argument("--text", type=Path, default=ROOT / "demo" / "heldout.txt")
    ap.add_argument("--tiny", choices=sorted(TINY), help="a random tiny model of this family")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(args, args.workdir or Path(tmp))
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{res['model']}: ctx {res['ctx']}, {res['windows']} windows, {res['positions']} "
          f"scored positions ({res['seconds']} s)")
    for name in ("f16_vs_f32", "orig_vs_f32", "orig_vs_f16"):
        if name in res:
            s = res[name]
            print(f"  {name:12} mean KL {s['kl_mean']:.3g} ± {s['kl_mean_se']:.2g}  "
                  f"p99 {s['kl_p99']:.3g}  top-1 {100 * s['top1']:.2f} %")


if __name__ == "__main__":
    main()
