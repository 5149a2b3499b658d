"""Run a command in its own memory cgroup and measure what it cost.

    python -m bench.cgroup --limit 2G -- CMD ARGS...      # prints the measurement as JSON

The cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`) is created for the one command and
removed afterwards. Page cache the command faults in is charged to that cgroup, so a model read
through mmap competes for the same limit as the process's own memory: this is how "RAM is short"
is simulated on a machine that has plenty.

Measured:
- peak memory charged to the cgroup (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`; anonymous
  memory *and* page cache), and the child's peak RSS (`ru_maxrss` from wait4);
- bytes the child read from the block device: the delta of this process's `/proc/self/io`
  `read_bytes` across the child's lifetime (the kernel adds a reaped child's I/O accounting to its
  parent; `read_bytes` is counted at bio submission, so it includes O_DIRECT reads and mmap
  page-fault read-ahead, and excludes page-cache hits);
- major page faults (`ru_majflt`), wall time, exit code, stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # v1 reports "no limit" as a page-rounded LONG_MAX


def parse_limit(text: str) -> int | None:
    """A cgroup memory limit file's content -> bytes, or None for no limit."""
    t = text.strip()
    if t in ("", "max"):
        return None
    v = int(t)
    return None if v >= UNLIMITED else v


def parse_kv(text: str) -> dict[str, int]:
    """`key value` or `key: value` lines (memory.stat, /proc/PID/io) -> dict of ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def io_counters(pid: int | str = "self") -> dict[str, int]:
    return parse_kv(Path(f"/proc/{pid}/io").read_text())


def cgroup_version() -> int | None:
    """1 or 2 for a writable memory controller, None when there is none."""
    if (V1_ROOT / "memory.limit_in_bytes").exists() and os.access(V1_ROOT, os.W_OK):
        return 1
    ctl = V2_ROOT / "cgroup.controllers"
    if ctl.exists() and "memory" in ctl.read_text().split() and os.access(V2_ROOT, os.W_OK):
        return 2
    return None


class MemoryCgroup:
    """A fresh memory cgroup with a hard limit (bytes); context manager that removes it."""

    def __init__(self, name: str, limit: int | None) -> None:
        self.version = cgroup_version()
        if self.version is None:
            raise RuntimeError("no writable memory cgroup controller (need root and cgroup v1 "
                               "memory or v2 with the memory controller)")
        root = V1_ROOT if self.version == 1 else V2_ROOT
        self.path = root / name
        self.path.mkdir(exist_ok=False)
        self.limit = limit
        if self.version == 2 and (root / "cgroup.subtree_control").exists():
            pass  # the memory controller is enabled for children of the root by systemd
        if limit is not None:
            f = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
            (self.path / f).write_text(str(int(limit)))
            if self.version == 1:  # no swap here, but make it explicit where memsw exists
                sw = self.path / "memory.memsw.limit_in_bytes"
                if sw.exists():
                    try:
                        sw.write_text(str(int(limit)))
                    except OSError:
                        pass

    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def peak(self) -> int | None:
        f = self.path / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        return int(f.read_text()) if f.exists() else None

    def stat(self) -> dict[str, int]:
        return parse_kv((self.path / "memory.stat").read_text())

    def failcnt(self) -> int | None:
        f = self.path / "memory.failcnt"
        return int(f.read_text()) if f.exists() else None

    def close(self) -> None:
        if self.version == 1:
            try:  # uncharge leftover page cache so rmdir never leaves it dangling
                (self.path / "memory.force_empty").write_text("0")
            except OSError:
                pass
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Measurement:
    cmd: list[str]
    limit_bytes: int | None
    rc: int
    wall_s: float
    peak_cgroup_bytes: int | None
    max_rss_bytes: int
    read_bytes: int
    major_faults: int
    failcnt: int | None
    stdout: str
    stderr_tail: str
    cgroup_version: int | None
    stat: dict[str, int] = field(default_factory=dict)

    def json_out(self) -> dict | None:
        """The last stdout line that parses as a JSON object (children print their result so)."""
        for line in reversed(self.stdout.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        return None


def run(cmd: list[str], limit: int | None, *, name: str | None = None,
        timeout: float | None = None, env: dict[str, str] | None = None,
        nice: int = 0, cpus: Collection[int] | None = None) -> Measurement:
    """Run `cmd` in a new memory cgroup limited to `limit` bytes (None: no limit, measured),
    pinned to `cpus` when given (engines compared on the same cores)."""
    name = name or f"moepack-bench-{os.getpid()}-{time.monotonic_ns()}"
    io0 = io_counters()
    with MemoryCgroup(name, limit) as cg:
        procs = str(cg.procs_file())

        def enter() -> None:  # in the child, before exec
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
            if nice:
                os.nice(nice)
            if cpus:
                os.sched_setaffinity(0, cpus)

        with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, preexec_fn=enter)
            timer = threading.Timer(timeout, p.kill) if timeout else None
            if timer:
                timer.start()
            _, status, ru = os.wait4(p.pid, 0)  # rusage of this child alone
            wall = time.perf_counter() - t0
            if timer:
                timer.cancel()
            p.returncode = os.waitstatus_to_exitcode(status)
            fo.seek(0)
            fe.seek(0)
            out, err = fo.read(), fe.read()
        io1 = io_counters()
        peak, stat, fc = cg.peak(), cg.stat(), cg.failcnt()
    return Measurement(
        cmd=list(cmd), limit_bytes=limit, rc=p.returncode, wall_s=wall, peak_cgroup_bytes=peak,
        max_rss_bytes=ru.ru_maxrss * 1024,
        read_bytes=io1.get("read_bytes", 0) - io0.get("read_bytes", 0),
        major_faults=ru.ru_majflt, failcnt=fc, stdout=out,
        stderr_tail=err[-4000:], cgroup_version=cg.version,
        stat={k: v for k, v in stat.items() if k in (
            "cache", "rss", "mapped_file", "pgmajfault", "total_pgmajfault", "file", "anon",
            "workingset_refault", "workingset_refault_file", "pgpgin")})



def main() -> None:
    from moepack.runtime.engine import parse_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", default=None, help="memory limit (e.g. 2G); default: none")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    m = run(cmd, parse_bytes(a.limit) if a.limit else None, timeout=a.timeout)
    d = asdict(m)
    d["stdout"] = d["stdout"][-2000:]
    json.dump(d, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
