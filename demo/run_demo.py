"""`make demo`: the whole toolkit on the shipped model, each step the command a user would type.

convert (--jobs 2) → info → verify → torrent create → seed + fetch over a loopback swarm →
plan → run the fetched copy with an expert budget smaller than its experts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MODEL = ROOT / "model"
OUT = ROOT / "out"
PROMPT = "def read_config(path):"


def moepack(*args: str, capture: bool = False) -> str:
    cmd = [sys.executable, "-m", "moepack", *args]
    if capture:  # read by the driver, not shown
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return done.stdout
    print(f"\n$ moepack {shlex.join(args)}", flush=True)
    subprocess.run(cmd, check=True)
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    container = OUT / "demo.moepack"
    torrent = OUT / "demo.torrent"
    fetched_dir = OUT / "fetched"

    moepack("convert", str(MODEL), str(container), "--jobs", "2")
    moepack("info", str(container))
    moepack("verify", str(container))
    moepack("torrent", "create", str(container), "-o", str(torrent))

    port = free_port()
    seed_cmd = [sys.executable, "-m", "moepack", "seed", str(torrent), "--path", str(container),
                "--listen", f"127.0.0.1:{port}"]
    print(f"\n$ moepack seed {torrent} --path {container} --listen 127.0.0.1:{port} &", flush=True)
    seeder = subprocess.Popen(seed_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)
        moepack("fetch", str(torrent), "--dest", str(fetched_dir), "--peer", f"127.0.0.1:{port}")
    finally:
        seeder.terminate()
        seeder.wait(timeout=10)

    copy = fetched_dir / container.name
    plan = json.loads(moepack("plan", str(copy), "--json", capture=True))
    moepack("plan", str(copy))
    budget = demo_budget(plan)
    moepack("run", str(copy), PROMPT, "-n", "64", "--budget", str(budget),
            "--temp", "0.7", "--top-p", "0.9", "--seed", "1")
    return 0


def demo_budget(plan: dict) -> int:
    """Just above the floor and far below the experts' total, so experts stream from disk."""
    return int(plan["floor_bytes"]) + int(plan["experts_bytes"]) // 8


if __name__ == "__main__":
    sys.exit(main())
