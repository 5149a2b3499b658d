"""Benchmark of `moepack serve` on the demo model: requests/s and time to first token (TTFT)
with 1, 4 and 8 concurrent streaming clients, and the server's time per token against
`moepack run` generating from the same prompt (both timed from outside, as a user sees them:
SSE chunks as they arrive; `run`'s stdout as it is flushed).

    python -m bench.serve [--container FILE] [--threads 1] [--tokens 256] [--repeat 3]

Without --container the demo model is converted into a temporary folder first. Prints a
markdown block for BENCHMARKS.md and writes bench/results/serve.json."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.machine import git_commit, machine_line, utc_now

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def read_config(path):"
RESULTS = ROOT / "bench" / "results" / "serve.json"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(container: Path, threads: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moepack", "serve", str(container), "--port",
                             str(port), "--threads", str(threads), "--max-queue", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def stream_once(port: int, prompt: str, max_tokens: int) -> dict:
    """One streamed /v1/completions request: TTFT, arrival time of every text chunk, usage."""
    body = json.dumps({"model": "demo", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    times, usage, engine_tok_s = [], None, 0.0
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        # parse only what must be parsed: the client's own cost is not the server's overhead
        if b'"text": ""' not in data and b'"choices": []' not in data:
            times.append(time.perf_counter() - t0)
        elif b'"usage"' in data:
            usage = json.loads(data)["usage"]
        elif b'"moepack_stats"' in data:
            engine_tok_s = json.loads(data)["moepack_stats"]["decode_tok_s"]
    conn.close()
    return {"ttft": times[0] if times else None, "times": times, "end": time.perf_counter() - t0,
            "usage": usage, "engine_decode_tok_s": engine_tok_s}


def per_token(times: list[float], tokens: int) -> float:
    return (times[-1] - times[0]) / max(1, tokens - 1)


def run_once(container: Path, threads: int, tokens: int) -> dict:
    """`moepack run` with its stdout read as it is flushed, token by token."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "moepack", "run", str(container), PROMPT,
                             "-n", str(tokens), "--threads", str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    reads: list[tuple[float, bytes]] = []
    assert proc.stdout is not None
    while True:
        b = os.read(proc.stdout.fileno(), 65536)
        if not b:
            break
        reads.append((time.perf_counter() - t0, b))
    proc.wait(timeout=60)
    text = b"".join(b for _, b in reads).decode(errors="replace")
    m = re.search(r"prompt (\d+) tok @ ([\d.]+) tok/s \| decode (\d+) tok @ ([\d.]+) tok/s", text)
    if not m:
        raise RuntimeError(f"no stats line in: {text[-300:]!r}")
    stats_at = text.rfind("\nprompt ")
    # the read holding the last token: the one where the text before the stats line ends
    seen, last = 0, reads[-1][0]
    for t, b in reads:
        seen += len(b.decode(errors="replace"))
        if seen >= stats_at:
            last = t
            break
    decode_tokens = int(m.group(3))
    return {"first": reads[0][0], "last": last, "decode_tokens": decode_tokens,
            "per_token": (last - reads[0][0]) / max(1, decode_tokens),
            "engine_prompt_s": int(m.group(1)) / float(m.group(2)),
            "engine_decode_tok_s": float(m.group(4))}


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_cpu(container: Path, threads: int, tokens: int) -> tuple[float, int]:
    """CPU seconds of a whole `moepack run` process and the tokens it decoded."""
    proc = subprocess.Popen([sys.executable, "-m", "moepack", "run", str(container), PROMPT,
                             "-n", str(tokens), "--threads", str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    m = re.search(r"decode (\d+) tok", out)
    if not m:
        raise RuntimeError(f"no stats line in: {out[-300:]!r}")
    return ru.ru_utime + ru.ru_stime, int(m.group(1))


def serve_cpu(pid: int, port: int, tokens: int) -> tuple[float, int]:
    """CPU seconds the server process spent on one streamed request, and its tokens."""
    c0 = proc_cpu(pid)
    r = stream_once(port, PROMPT, tokens)
    return proc_cpu(pid) - c0, r["usage"]["completion_tokens"]


def cpu_per_token(short: tuple[float, int], long: tuple[float, int]) -> float:
    """The difference of a long and a short generation: startup and prompt cancel out."""
    return (long[0] - short[0]) / max(1, long[1] - short[1])


def concurrent(port: int, clients: int, per_client: int, max_tokens: int) -> dict:
    out: list[dict] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for j in range(per_client):
            # a different start per request: no request gets the previous one's KV prefix
            r = stream_once(port, f"# request {k}.{j}\n{PROMPT}", max_tokens)
            with lock:
                out.append(r)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in out)
    toks = sum(r["usage"]["completion_tokens"] for r in out)
    return {"clients": clients, "requests": len(out), "wall_s": wall,
            "requests_per_s": len(out) / wall, "tokens_per_s": toks / wall,
            "ttft_mean_s": statistics.mean(ttft), "ttft_p50_s": ttft[len(ttft) // 2],
            "ttft_p95_s": ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))],
            "per_token_ms": 1e3 * statistics.median(
                per_token(r["times"], r["usage"]["completion_tokens"]) for r in out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--container", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64, help="per request, concurrency rows")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="moepack-bench-serve-") as tmp:
        container = a.container
        if container is None:
            from moepack.convert.pipeline import convert
            from moepack.convert.settings import Settings

            container = Path(tmp) / "demo.moepack"
            convert(ROOT / "demo" / "model", container, Settings(), jobs=2)
        proc, port = start_server(container, a.threads)
        try:
            stream_once(port, PROMPT, 16)  # warm: expert cache, page cache, first-call costs
            runs, serves = [], []
            for _ in range(a.repeat):  # alternated, so drifting machine load hits both alike
                runs.append(run_once(container, a.threads, a.tokens))
                s = stream_once(port, PROMPT, a.tokens)
                s["per_token"] = per_token(s["times"], s["usage"]["completion_tokens"])
                serves.append(s)
            cpu_run, cpu_srv = [], []
            for _ in range(a.repeat):
                cpu_run.append(cpu_per_token(run_cpu(container, a.threads, 2),
                                             run_cpu(container, a.threads, a.tokens)))
                cpu_srv.append(cpu_per_token(serve_cpu(proc.pid, port, 2),
                                             serve_cpu(proc.pid, port, a.tokens)))
            rows = [concurrent(port, c, a.per_client, a.max_tokens) for c in (1, 4, 8)]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    run_pt = statistics.median(r["per_token"] for r in runs)
    srv_pt = statistics.median(s["per_token"] for s in serves)
    res = {"date": utc_now(),
           "commit": git_commit(), "hardware": machine_line(), "threads": a.threads,
           "load_avg_start_end": [load0, os.getloadavg()[0]], "prompt": PROMPT,
           "tokens": a.tokens, "repeat": a.repeat,
           "run_per_token_ms": 1e3 * run_pt, "serve_per_token_ms": 1e3 * srv_pt,
           "overhead_per_token": srv_pt / run_pt - 1,
           "run_engine_decode_tok_s": statistics.median(r["engine_decode_tok_s"] for r in runs),
           "serve_engine_decode_tok_s": statistics.median(
               s["engine_decode_tok_s"] for s in serves),
           "run_per_token_ms_all": [1e3 * r["per_token"] for r in runs],
           "serve_per_token_ms_all": [1e3 * s["per_token"] for s in serves],
           "serve_completion_tokens": [s["usage"]["completion_tokens"] for s in serves],
           "run_decode_tokens": [r["decode_tokens"] for r in runs],
           "serve_ttft_s": statistics.median(s["ttft"] for s in serves),
           "run_engine_prompt_s": statistics.median(r["engine_prompt_s"] for r in runs),
           "run_cpu_per_token_ms": 1e3 * statistics.median(cpu_run),
           "serve_cpu_per_token_ms": 1e3 * statistics.median(cpu_srv),
           "cpu_overhead_per_token": statistics.median(cpu_srv) / statistics.median(cpu_run) - 1,
           "concurrency": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2) + "\n")
    print(render(res))


def render(r: dict) -> str:
    pairs = ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(
        r["run_per_token_ms_all"], r["serve_per_token_ms_all"], strict=True))
    lines = [f"## moepack serve: {r['date']}, commit {r['commit']}", "",
             f"- Hardware: {r['hardware']}; {r['threads']} compute thread(s) for both "
             f"`moepack run` and the server; load average (1 min) at start / end: "
             f"{r['load_avg_start_end'][0]:.1f} / {r['load_avg_start_end'][1]:.1f}.",
             f"- Model: the demo model (`demo/model`, converted with the defaults); prompt "
             f"`{r['prompt']}`, greedy.", "",
             "### Time per token, server vs `moepack run` (same prompt, "
             f"{r['tokens']} tokens, median of {r['repeat']}, timed from outside)", "",
             "| | ms / token | tok/s |", "|---|---|---|",
             f"| `moepack run` (stdout as flushed) | {r['run_per_token_ms']:.3f} | "
             f"{1e3 / r['run_per_token_ms']:.0f} |",
             f"| `moepack serve`, one streaming client (SSE chunks as received) | "
             f"{r['serve_per_token_ms']:.3f} | {1e3 / r['serve_per_token_ms']:.0f} |",
             "", f"Server overhead per token: **{100 * r['overhead_per_token']:+.1f} %** "
             f"(engine decode alone: {r['run_engine_decode_tok_s']:.0f} tok/s inside `run`, "
             f"{r['serve_engine_decode_tok_s']:.0f} tok/s inside the server). Every pair, "
             f"run / serve ms: {pairs}. "
             f"TTFT of one client: {1e3 * r['serve_ttft_s']:.1f} ms, against "
             f"{1e3 * r['run_engine_prompt_s']:.1f} ms of prompt evaluation inside `run`.", "",
             "### CPU time per token (user + system, all threads; long minus short "
             f"generation; median of {r['repeat']})", "",
             "Wall time on a shared machine swings with the load; CPU time counts the work "
             "itself: `moepack run`'s process against the server's process (engine, worker, "
             "HTTP and SSE).", "",
             "| | CPU ms / token |", "|---|---|",
             f"| `moepack run` | {r['run_cpu_per_token_ms']:.3f} |",
             f"| `moepack serve` | {r['serve_cpu_per_token_ms']:.3f} |", "",
             f"Server CPU overhead per token: **{100 * r['cpu_overhead_per_token']:+.1f} %**.",
             "",
             "### Concurrent streaming clients (each sends requests back to back; "
             "one engine, requests queue)", "",
             "| clients | requests | requests/s | tokens/s | TTFT mean / p50 / p95 (ms) | "
             "ms / token |", "|---|---|---|---|---|---|"]
    for c in r["concurrency"]:
        lines.append(f"| {c['clients']} | {c['requests']} | {c['requests_per_s']:.2f} | "
                     f"{c['tokens_per_s']:.0f} | {1e3 * c['ttft_mean_s']:.0f} / "
                     f"{1e3 * c['ttft_p50_s']:.0f} / {1e3 * c['ttft_p95_s']:.0f} | "
                     f"{c['per_token_ms']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
