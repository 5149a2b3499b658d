"""What every benchmark records about the run: commit, date, CPU and the machine line.

One copy for all of bench/: each figure in the documents must say where and at which commit it
was measured, and the same words should mean the same facts in every record."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIMD_FLAGS = ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512vbmi",
              "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def git_commit() -> str:
    """Short hash of HEAD, `+dirty` when tracked files differ from it; `unknown` without git."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def utc_now() -> str:
    """`YYYY-MM-DD HH:MM UTC`, the date format of every record."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def lscpu() -> dict:
    """CPU model, count, threads per core, L3, the SIMD flags the kernels use, RAM and kernel."""
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "L3 cache", "Flags")
    out: dict = {}
    try:
        txt = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        txt = ""
    for line in txt.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in keep:
            v = v.strip()
            if k.strip() == "Flags":
                v = " ".join(f for f in v.split() if f in ("avx2", "fma", "avx512f"))
            out[k.strip()] = v
    try:
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        out["MemTotal GB"] = round(int(mem) * 1024 / 1e9, 1)
    except (OSError, IndexError, ValueError):
        pass
    if "Model name" in out:  # with the family and model numbers, as every other record says it
        out["Model name"] = cpu_model()
    out["kernel"] = f"{platform.system()} {platform.release()}"
    return out


def _first_cpu(cpuinfo: Path) -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (its block ends at the first blank line); empty
    when the file cannot be read."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if not sep:
            break
        fields.setdefault(k.strip(), v.strip())
    return fields


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name with its family and model numbers (/proc/cpuinfo, else what platform
    says): VMs often name only the brand ("AMD EPYC"), and the numbers tell Zen 3, 4 and 5 apart."""
    f = _first_cpu(cpuinfo)
    name, fam, mod = f.get("model name"), f.get("cpu family"), f.get("model")
    if name:
        return f"{name} (family {fam}, model {mod})" if fam and mod else name
    return platform.processor() or "unknown CPU"


def cpu_simd_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Which of SIMD_FLAGS the CPU has (the kernel paths the engine can choose from)."""
    have = set(_first_cpu(cpuinfo).get("flags", "").split())
    return [f for f in SIMD_FLAGS if f in have]


def machine_line() -> str:
    """`MODEL, N CPUs, Linux 6.x`: the hardware sentence of a record (N: the machine's CPUs,
    os.cpu_count(), not what this process may use: that is moepack.sysinfo.usable_cores())."""
    return f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
