"""Expert-cache sweep: hit rate and decode speed as the moepack budget grows from the floor to
past usable RAM, and the moepack child process used by every engine run of the benchmark.

    python -m bench.cache_sweep --model M.moepack [--cap-frac 0.5] [--tokens 16]    # the sweep
    python -m bench.cache_sweep --child --model M.moepack [--budget 3G] ...          # one run

The sweep runs each point as a fresh process in its own memory cgroup (bench.cgroup) capped at
`--cap-frac` of the container size, so "usable RAM" is the cap and budgets above it are really
above it. Points: the floor, floor + k x (one token's experts) for the k the default rule
considers, then fractions of all experts up to past the cap. Each point reports hit rate,
decode tok/s, bytes read, peak memory, and whether the engine was refused or killed.
Writes bench/results/cache_sweep.json and a PNG (matplotlib, if installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from moepack.sysinfo import usable_cores


def engine_fingerprint() -> dict:
    """Which build of the engine library ran (other sessions rebuild it while benches run)."""
    import blake3
    import moepack.runtime

    libs = sorted(Path(moepack.runtime.__file__).parent.glob("_engine*.so"))
    if not libs:
        return {}
    f = libs[0]
    return {"lib": f.name, "mtime": int(f.stat().st_mtime),
            "blake3": blake3.blake3(f.read_bytes()).hexdigest()[:16]}


def child(model: str, prompt: list[int], tokens: int, threads: int, passes: int,
          budget: int | None, cache_experts: int | None, ctx: int = 256,
          forced: list[int] | None = None, chunk: int | None = None) -> dict:
    """One engine run. `forced`: feed these ids one at a time after the prompt (decode steps on
    a fixed token stream, the same for every engine) instead of greedy generation. `chunk`:
    passes of exactly that many prompt tokens (None: the memory plan's)."""
    from moepack.runtime.engine import Engine

    if budget == -1:  # "floor": this engine build's own floor (builds change while benches run)
        from moepack.runtime.engine import plan as mp_plan
        budget = mp_plan(model, ctx)["floor_bytes"]
    t0 = time.perf_counter()
    e = Engine(model, budget=budget or None, threads=threads, ctx=ctx,
               cache_experts=cache_experts, chunk=chunk)
    load_s = time.perf_counter() - t0
    runs = []
    for i in range(passes):
        # pass 1 is the cold start; a later pass is the steady state, so it waits for the
        # warm-up (mp_config.warm) to finish reading: the wait is recorded, not hidden
        waited = time.perf_counter()
        while i and e.stats()["warming"] and time.perf_counter() - waited < 300:
            time.sleep(0.05)
        waited = time.perf_counter() - waited
        e.reset_stats()
        if forced:
            e.reset()
            e.feed(prompt)
            for t in forced:
                e.feed([t])
            out = list(forced)
        else:
            out = list(e.generate(prompt, tokens))
        s = e.stats()
        s["tokens"] = out[:8]
        s["warm_wait_s"] = waited
        runs.append(s)
    plan = e.plan()
    e.close()
    return {"engine": "moepack", "load_s": load_s, "passes": runs, "plan": plan,
            "threads": threads, "build": engine_fingerprint()}


def sweep_points(plan: dict, cap: int, every: int) -> list[tuple[str, int]]:
    """(label, budget bytes) from the floor to past the cap; `every` = all expert records."""
    floor, step = plan["floor_bytes"], plan["step_expert_bytes"]
    pts = [("floor", floor)] + [(f"floor+{k}xstep", floor + k * step) for k in (1, 2, 3)]
    for frac in (0.25, 0.5, 0.75, 1.0):
        pts.append((f"floor+{frac:g}xall", floor + int(frac * every)))
    pts += [("0.9xcap", int(0.9 * cap)), ("1.0xcap", cap), ("1.25xcap", int(1.25 * cap))]
    seen, out = set(), []
    for label, b in sorted(pts, key=lambda p: p[1]):
        if b >= floor and b not in seen:
            seen.add(b)
            out.append((label, b))
    return out


def run_sweep(model: Path, *, cap: int, prompt: list[int], tokens: int, threads: int,
              nice: int = 5, timeout: float = 900, forced: list[int] | None = None) -> dict:
    from moepack.format.reader import Container
    from moepack.runtime.engine import plan as mp_plan

    from bench import cgroup
    from bench.disk import drop_cache

    p = mp_plan(str(model), 256)
    with Container.open(model) as c:
        every = sum(b["count"] * b["stride"] for b in c.banks())
    points = []
    killed_at = None
    for label, budget in sweep_points(p, cap, every):
        if killed_at is not None:  # a smaller budget already died: larger ones die the same way
            points.append({"label": label, "budget_bytes": budget, "budget_over_cap":
                           budget / cap, "rc": None, "skipped": f"killed at {killed_at}",
                           "error": [f"not run: {killed_at / 1e9:.2f} GB was already killed"]})
            continue
        drop_cache(model)
        m = cgroup.run([sys.executable, "-m", "bench.cache_sweep", "--child", "--model",
                        str(model), "--budget", "-1" if label == "floor" else str(budget),
                        "--prompt",
                        ",".join(map(str, prompt)), "--tokens", str(tokens), "--threads",
                        str(threads), "--passes", "1"]
                       + (["--forced", ",".join(map(str, forced))] if forced else []),
                       cap, timeout=timeout, nice=nice)
        r = m.json_out()
        pt = {"label": label, "budget_bytes": budget, "budget_over_cap": budget / cap,
              "rc": m.rc, "peak_cgroup_bytes": m.peak_cgroup_bytes, "read_bytes": m.read_bytes,
              "wall_s": m.wall_s}
        if r:
            s = r["passes"][-1]
            pt.update(decode_tok_s=s["decode_tok_s"], hit_rate=s["hit_rate"],
                      cache_experts=s["cache_capacity_experts"],
                      io_wait_share=s["io_wait_share"])
        else:
            pt["error"] = m.stderr_tail.strip().splitlines()[-1:] or [f"rc {m.rc}"]
            pt["killed"] = m.rc < 0 or m.rc == 137
            if pt["killed"] and budget > cap:
                killed_at = budget
        points.append(pt)
        keys = ("budget_bytes", "hit_rate", "decode_tok_s", "rc")
        print(f"  sweep {label:>16}: {json.dumps({k: pt.get(k) for k in keys})}", flush=True)
    r = cgroup.run([sys.executable, "-c", "import json; from moepack.runtime.engine import "
                    f"plan; print(json.dumps(plan({str(model)!r}, 256)))"], cap)
    default_under_cap = (r.json_out() or {}).get("default_bytes")
    return {"model": str(model), "cap_bytes": cap, "plan": p, "all_experts_bytes": every,
            "default_budget_under_cap": default_under_cap, "tokens": tokens, "points": points}


def plot(result: dict, png: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"no plot: {e}"
    pts = [p for p in result["points"] if "decode_tok_s" in p]
    if not pts:
        return "no plot: no successful point"
    x = [p["budget_bytes"] / 1e9 for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [p["decode_tok_s"] for p in pts], "o-", label="decode tok/s")
    ax.set_xlabel("expert budget (GB)")
    ax.set_ylabel("decode tok/s")
    ax2 = ax.twinx()
    ax2.plot(x, [100 * p["hit_rate"] for p in pts], "s--", color="tab:orange",
             label="cache hits %")
    ax2.set_ylabel("cache hits %")
    cap = result["cap_bytes"] / 1e9
    ax.axvline(cap, color="red", lw=1, label=f"cgroup cap {cap:.2f} GB")
    if result.get("default_budget_under_cap"):
        ax.axvline(result["default_budget_under_cap"] / 1e9, color="green", lw=1, ls=":",
                   label="default budget")
    for p in result["points"]:
        if "decode_tok_s" not in p:
            ax.axvline(p["budget_bytes"] / 1e9, color="black", lw=1, ls="--")
            ax.annotate("killed/refused", (p["budget_bytes"] / 1e9, 0), rotation=90, fontsize=7)
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="lower right", fontsize=7)
    ax.set_title("moepack expert cache sweep (synthetic model, random routing)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--budget", type=int, default=0, help="bytes; 0 = default, -1 = the floor")
    ap.add_argument("--cache-experts", type=int, default=None)
    ap.add_argument("--prompt", default="1,2,3,4")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=usable_cores())
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--cap-frac", type=float, default=0.5)
    ap.add_argument("--forced", default="", help="comma-separated decode token ids (no greedy)")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=None, help="prompt tokens a pass (default: plan)")
    a = ap.parse_args()
    prompt = [int(t) for t in a.prompt.split(",")]
    forced = [int(t) for t in a.forced.split(",")] if a.forced else None
    if a.child:
        print(json.dumps(child(a.model, prompt, a.tokens, a.threads, a.passes, a.budget,
                               a.cache_experts, ctx=a.ctx, forced=forced, chunk=a.chunk)),
              flush=True)
        return
    cap = int(a.cap_frac * Path(a.model).stat().st_size)
    res = run_sweep(Path(a.model), cap=cap, prompt=prompt, tokens=a.tokens, threads=a.threads)
    out = Path("bench/results/cache_sweep.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(plot(res, out.with_suffix(".png")) or f"wrote {out}")


if __name__ == "__main__":
    main()
