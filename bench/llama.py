"""The llama.cpp side of the benchmark: decode speed through llama-cpp-python, default mmap.

    python -m bench.llama --model M.gguf --prompt 1,2,3 --tokens 16 --threads 2 [--passes 2]

Run as a child (usually inside bench.cgroup): loads the GGUF with llama.cpp's defaults (mmap on,
mlock off), feeds the prompt token ids, then decodes greedily one token at a time, `--passes`
times from a fresh KV cache (pass 1 = what a cold start costs, later passes = steady state with
whatever the page cache kept). Prints one JSON line with the timings of every pass.

One deviation from llama.cpp's defaults, on purpose: `use_extra_bufts = False`. With extra buffer
types on, a CPU that reports AMX makes llama.cpp copy weights into AMX/repacked anonymous buffers
(no longer mmap), and on this VM the AMX tile instructions then die with SIGILL (the hypervisor
advertises AMX but does not enable tile state; on a later Xeon VM that does enable it, where
moepack's own AMX kernels run, llama-cpp-python 0.3.36 with extra buffer types died with SIGSEGV
on the IQ3_XXS twin's 512-token prompt, 2026-12-05). Without them the weights stay in the mmap,
which is the GGUF + mmap behaviour the comparison is about.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def available() -> str | None:
    """None when llama-cpp-python imports, else why not."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure means: not available)
        return f"{type(e).__name__}: {e}"
    return None


def decode(model: str, prompt: list[int], tokens: int, threads: int, passes: int,
           ctx: int = 256, forced: list[int] | None = None) -> dict:
    """`forced`: feed these ids one at a time after the prompt instead of greedy decoding."""
    import llama_cpp
    import llama_cpp.llama_cpp as C

    default_params = C.llama_model_default_params

    def params():  # see the module docstring
        p = default_params()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    C.llama_model_default_params = params
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_threads=threads,
                          n_threads_batch=threads, n_batch=max(32, len(prompt)), use_mmap=True,
                          use_mlock=False, verbose=False, logits_all=False, n_gpu_layers=0)
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()

    def last_logits() -> np.ndarray:  # llm.scores is not filled without logits_all
        return np.ctypeslib.as_array(C.llama_get_logits(llm._ctx.ctx), shape=(n_vocab,))
    runs = []
    for _ in range(passes):
        llm.reset()
        t1 = time.perf_counter()
        llm.eval(prompt)
        t2 = time.perf_counter()
        out = []
        for i in range(len(forced) if forced else tokens):
            tok = forced[i] if forced else int(np.argmax(last_logits()))
            out.append(tok)
            llm.eval([tok])
        t3 = time.perf_counter()
        runs.append({"prompt_tokens": len(prompt), "prompt_s": t2 - t1,
                     "decode_tokens": len(out), "decode_s": t3 - t2,
                     "decode_tok_s": len(out) / (t3 - t2),
                     "prompt_tok_s": len(prompt) / (t2 - t1),
                     "tokens": out[:8]})
    return {"engine": "llama.cpp", "version": getattr(llama_cpp, "__version__", "?"),
            "load_s": load_s, "passes": runs, "threads": threads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", default="1,2,3,4")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--forced", default="", help="comma-separated decode token ids (no greedy)")
    ap.add_argument("--ctx", type=int, default=256)
    a = ap.parse_args()
    prompt = [int(t) for t in a.prompt.split(",")]
    forced = [int(t) for t in a.forced.split(",")] if a.forced else None
    print(json.dumps(decode(a.model, prompt, a.tokens, a.threads, a.passes, ctx=a.ctx,
                            forced=forced)),
          flush=True)


if __name__ == "__main__":
    main()
