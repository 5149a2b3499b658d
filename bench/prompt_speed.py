"""Prompt-processing speed of the C engine, everything cached (issue 15): a synthetic
Mixtral-shaped container (random rvq3 experts, q8 attention) and one prompt of N tokens, best of
`--repeat` runs.  Prints one JSON line.

    python -m bench.prompt_speed [--tokens 256] [--threads 2] [--layers 4] [--experts 8]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from moepack.runtime.engine import Engine, plan

from bench.machine import git_commit
from bench.runtime import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="moepack-prompt-", dir="/var/tmp"))
    path = d / "prompt.moepack"
    try:
        build(path, a.layers, a.experts, a.hidden, a.inter, a.top_k)
        p = plan(str(path), a.tokens + 8)
        every = a.layers * a.experts * p["expert_record_bytes"]
        prompt = [1 + (7 * i) % 4000 for i in range(a.tokens)]
        load0 = os.getloadavg()[0]
        best = 0.0
        with Engine(str(path), ctx=a.tokens + 8, threads=a.threads,
                    budget=p["floor_bytes"] + every + (64 << 20)) as e:
            e.feed(prompt[:16])  # first touch: experts read into the cache
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                e.reset()
                e.feed(prompt)
                best = max(best, a.tokens / (time.perf_counter() - t0))
        print(json.dumps({"commit": git_commit(), "tokens": a.tokens, "threads": a.threads,
                          "layers": a.layers, "experts": a.experts, "top_k": a.top_k,
                          "hidden": a.hidden, "inter": a.inter, "prompt_tok_s": round(best, 2),
                          "load_1min": [round(load0, 1), round(os.getloadavg()[0], 1)]}))
    finally:
        path.unlink(missing_ok=True)
        d.rmdir()


if __name__ == "__main__":
    main()
