"""llama.cpp side of bench/quality.py: the same model and token ids through llama.cpp.

1. Convert the Hugging Face checkpoint to GGUF F32 with `convert_hf_to_gguf.py` from the
   llama-cpp-python source package (its `vendor/llama.cpp`, with its own `gguf-py`). The sdist is
   looked for in $LLAMA_CPP_SDIST, /tmp/llsdist and WORKDIR (get it with
   `pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/llsdist`). A BPE
   pre-tokenizer hash the converter does not know is mapped to "default": only the weights matter
   here, token ids are given to llama.cpp directly.
2. Quantize to Q3_K_M and Q4_K_M with `llama_cpp.llama_model_quantize`.
3. Teacher-forced logits of every window (`Llama(logits_all=True)`, default f16 KV cache as
   `llama-perplexity`), compared by bench/kl.py against llama.cpp's own F32 (the issue's
   yardstick, llama.cpp's `--kl-divergence`) and against the original in transformers.

    python -m bench.llama_quality --reference demo/model --text demo/heldout.txt [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

from bench import kl

FTYPES = ("Q3_K_M", "Q4_K_M")

_WRAPPER = r"""
import sys
llama_dir, gguf_py, src, out = sys.argv[1:5]
sys.path.insert(0, gguf_py)
sys.path.insert(0, llama_dir)
import transformers  # noqa: F401  (before the stub below: it probes for sentencepiece)
try:
    import sentencepiece  # noqa: F401
except ImportError:  # the converter tries SentencePiece first and expects FileNotFoundError
    import types
    stub = types.ModuleType("sentencepiece")
    class SentencePieceProcessor:
        def __init__(self, *a, **k):
            raise FileNotFoundError("sentencepiece not installed")
    stub.SentencePieceProcessor = SentencePieceProcessor
    sys.modules["sentencepiece"] = stub
import convert_hf_to_gguf as c
try:
    from conversion import TextModel as base  # llama.cpp since 2026: models in conversion/
except ImportError:
    base = getattr(c, "TextModel", None) or c.Model
orig = base.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        print("moepack: unknown BPE pre-tokenizer hash, using 'default' (ids are fed directly)",
              file=sys.stderr)
        return "default"
base.get_vocab_base_pre = pre
sys.argv = ["convert_hf_to_gguf.py", src, "--outtype", "f32", "--outfile", out]
c.main()
"""


def find_sdist(work: Path) -> Path | None:
    """Directory of an unpacked llama-cpp-python sdist (unpacked into WORKDIR if needed)."""
    cands = [os.environ.get("LLAMA_CPP_SDIST", ""), "/tmp/llsdist", str(work)]
    for c in cands:
        if not c:
            continue
        p = Path(c)
        if (p / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").exists():
            return p
        for d in sorted(glob.glob(str(p / "llama_cpp_python-*"))):
            if (Path(d) / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").exists():
                return Path(d)
        for tgz in sorted(glob.glob(str(p / "llama_cpp_python-*.tar.gz"))):
            with tarfile.open(tgz) as tf:
                members = [m for m in tf.getmembers()
                           if "/vendor/llama.cpp/" in m.name
                           and ("convert_hf_to_gguf" in m.name or "/gguf-py/" in m.name)]
                tf.extractall(work, members=members, filter="data")
            d = work / Path(tgz).name[: -len(".tar.gz")]
            if (d / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").exists():
                return d
    return None


def convert_f32(src: Path, out: Path, sdist: Path) -> str:
    llama_dir = sdist / "vendor" / "llama.cpp"
    r = subprocess.run([sys.executable, "-c", _WRAPPER, str(llama_dir),
                        str(llama_dir / "gguf-py"), str(src), str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-15:]
        raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {r.returncode}):\n    "
                           + "\n    ".join(tail))
    return r.stderr


def quantize(f32: Path, out: Path, ftype: str, threads: int | None) -> None:
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    p.nthread = int(threads or 0)
    rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), p)
    if rc != 0 or not out.exists():
        raise RuntimeError(f"llama_model_quantize({ftype}) returned {rc}")


def gguf_size(path: Path) -> dict:
    """File size, tensor bytes, bits/weight (all and *_exps tensors), tensor types by role."""
    from gguf import GGUFReader

    rd = GGUFReader(str(path))
    nb = ne = enb = ene = 0
    types: Counter = Counter()
    for t in rd.tensors:
        nb += int(t.n_bytes)
        ne += int(t.n_elements)
        if "_exps" in t.name:
            enb += int(t.n_bytes)
            ene += int(t.n_elements)
        role = re.sub(r"^blk\.\d+\.", "blk.N.", t.name)
        types[(role, t.tensor_type.name)] += 1
    return {"file_size": path.stat().st_size, "weight_bytes": nb, "parameters": ne,
            "bpw": round(8 * nb / ne, 4), "bpw_experts": round(8 * enb / ene, 4) if ene else None,
            "tensor_types": {f"{r}: {ty}": n for (r, ty), n in sorted(types.items())}}


def gguf_logits(path: Path, win, threads: int | None) -> np.ndarray:
    """float32 [W, ctx-1-first, vocab] of llama.cpp over the windows' token ids."""
    import llama_cpp.llama_cpp as lc
    from llama_cpp import Llama

    # No "extra buffer types" (AMX, CPU repack): on a VM that advertises AMX without enabling it
    # (this machine) the AMX buffer dies with SIGILL on the first K-quant matmul. Llama() has no
    # option for it, so its default model params are patched for this one call.
    orig = lc.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p

    lc.llama_model_default_params = params
    try:
        llm = Llama(str(path), n_ctx=win.ctx, n_batch=win.ctx, n_ubatch=win.ctx,
                    logits_all=True, n_threads=threads, n_threads_batch=threads, verbose=False)
    finally:
        lc.llama_model_default_params = orig
    try:
        out = []
        for row in win.tokens:
            llm.reset()
            llm.eval(row.tolist())
            out.append(np.array(llm.scores[win.first:win.ctx - 1], dtype=np.float32))
        return np.stack(out)
    finally:
        llm.close()


def _stats(ref: np.ndarray, q: np.ndarray, win) -> dict:
    parts = [kl.position_stats(ref[i], q[i], win.targets[i]) for i in range(len(ref))]
    return kl.summarize(kl.concat(parts))


def run(src: Path, win, ref: np.ndarray | None, work: Path, threads: int | None = None) -> dict:
    """Rows of the llama.cpp table (or {"error": why} when the path fails)."""
    res: dict = {"rows": {}, "notes": []}
    try:
        import llama_cpp
    except Exception as e:  # noqa: BLE001 - record exactly why
        return {"error": f"llama_cpp not importable: {type(e).__name__}: {e}"}
    res["version"] = llama_cpp.__version__
    sdist = find_sdist(work)
    if sdist is None:
        return {"error": "no llama-cpp-python sdist with vendor/llama.cpp/convert_hf_to_gguf.py "
                "(pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/llsdist)"}
    f32 = work / "model-f32.gguf"
    try:
        t0 = time.monotonic()
        log = convert_f32(src, f32, sdist)
        if "unknown BPE pre-tokenizer" in log:
            res["notes"].append("- The converter did not know the demo tokenizer's BPE "
                                "pre-tokenizer hash; it was mapped to `default` (token ids are "
                                "fed to llama.cpp directly, so only the weights matter).")
        print(f"GGUF F32 in {time.monotonic() - t0:.0f} s", flush=True)
        files = {"F32": f32}
        for ft in FTYPES:
            files[ft] = work / f"model-{ft}.gguf"
            quantize(f32, files[ft], ft, threads)
        sizes = {k: gguf_size(v) for k, v in files.items()}
        logits = {}
        for k, v in files.items():
            t0 = time.monotonic()
            logits[k] = gguf_logits(v, win, threads)
            print(f"llama.cpp {k} logits {logits[k].shape} in {time.monotonic() - t0:.0f} s",
                  flush=True)
    except Exception as e:  # noqa: BLE001 - the doc states why this part is missing
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {e}"
        return res
    vocab = logits["F32"].shape[-1]
    if ref is not None and ref.shape[-1] != vocab:
        res["notes"].append(f"- llama.cpp vocabulary {vocab} ≠ transformers' {ref.shape[-1]}; "
                            "rows against the original were skipped.")
        ref = None
    if ref is not None:
        res["rows"]["llama.cpp F32 vs original (sanity)"] = {**_stats(ref, logits["F32"], win),
                                                               **sizes["F32"]}
    for ft in FTYPES:
        res["rows"][f"{ft} vs llama.cpp F32"] = {**_stats(logits["F32"], logits[ft], win),
                                                 **sizes[ft]}
    if ref is not None:
        for ft in FTYPES:
            res["rows"][f"{ft} vs original"] = {**_stats(ref, logits[ft], win), **sizes[ft]}
    res["sizes"] = sizes
    res["notes"].append(f"- llama-cpp-python {res['version']} (its vendored llama.cpp), CPU, "
                        "f16 KV cache (llama-perplexity's default), extra buffer types (AMX, "
                        "repack) off (AMX is advertised by this VM's CPU but SIGILLs), "
                        "GGUF converted from "
                        f"`{src}` with `--outtype f32`.")
    for ft in FTYPES:
        kinds = ", ".join(f"{k} ×{n}" for k, n in sizes[ft]["tensor_types"].items()
                          if not k.split(":")[0].endswith("norm.weight"))
        res["notes"].append(f"- {ft} tensor types (norms F32 omitted): {kinds}.")
    return res


def main(argv: list[str] | None = None) -> int:
    from bench.quality import FMT_HEAD, FMT_RULE, fmt_row, load_windows, reference_logits

    ap = argparse.ArgumentParser(prog="python -m bench.llama_quality")
    ap.add_argument("--reference", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--first", type=int, default=None)
    ap.add_argument("--windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/moepack-quality"))
    ap.add_argument("--no-reference", action="store_true", help="skip transformers")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    a.workdir.mkdir(parents=True, exist_ok=True)
    win = load_windows(a.reference, a.text, a.ctx, a.first, a.windows)
    ref = None if a.no_reference else reference_logits(a.reference, win, threads=a.threads)
    res = run(a.reference, win, ref, a.workdir, a.threads)
    if a.json:
        print(json.dumps(res, sort_keys=True))
        return 0 if not res.get("error") else 1
    if res.get("error"):
        print("llama.cpp path failed:", res["error"])
    print("\n".join(res.get("notes", [])))
    print(FMT_HEAD)
    print(FMT_RULE)
    for name, r in res.get("rows", {}).items():
        print(fmt_row(name, r))
    return 0 if not res.get("error") else 1


if __name__ == "__main__":
    sys.exit(main())
