"""What this process may use: usable cores and usable memory, cgroup-aware (v1 and v2).

One helper for convert, verify and anything else in Python; `runtime/src/memplan.c` applies
the same rules in C (`mp_usable_ram`; `mp_usable_cores`, the engine's default thread count):

- cores: the CPUs in this process's affinity mask, lowered to the cgroup CPU quota where one is
  set (v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, the tightest of the cgroup and
  its ancestors), rounded up (a quota of 1.5 CPUs keeps 2 busy), at least 1;
- memory: the smallest of MemTotal, MemAvailable and the cgroup memory limit (v2 `memory.max`
  and `memory.high`, v1 `memory.limit_in_bytes`, the tightest along the path to the root).

The roots are parameters so tests can describe any machine with a few files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
_NO_LIMIT = 1 << 62   # v1 writes ~2^63 (PAGE_COUNTER_MAX pages) for "no limit"


@dataclass(frozen=True)
class Cores:
    usable: int             # what to plan for
    affinity: int           # CPUs this process may run on
    quota: float | None     # cgroup CPU quota in CPUs (None: no quota)


@dataclass(frozen=True)
class Memory:
    usable: int | None      # bytes: min(total, available, cgroup limit); None: unknown
    total: int | None
    available: int | None
    cgroup_limit: int | None
    limit_file: str | None  # where the cgroup limit came from


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cores(proc: Path = PROC, cgroup: Path = CGROUP, affinity: int | None = None) -> Cores:
    aff = affinity if affinity is not None else affinity_cores()
    quota = cpu_quota(proc, cgroup)
    usable = aff if quota is None else min(aff, max(1, math.ceil(quota - 1e-9)))
    return Cores(max(1, usable), aff, quota)


def usable_cores() -> int:
    """Cores this process can keep busy (affinity, cgroup CPU quota)."""
    return cores().usable


def memory(proc: Path = PROC, cgroup: Path = CGROUP) -> Memory:
    info = _meminfo(proc / "meminfo")
    total, avail = info.get("MemTotal"), info.get("MemAvailable")
    limit, where = None, None
    for file in _cgroup_files(proc, cgroup, "memory",
                              ("memory.max", "memory.high"), ("memory.limit_in_bytes",)):
        v = _read_int(file)
        if v is not None and v < _NO_LIMIT and (limit is None or v < limit):
            limit, where = v, str(file)
    known = [v for v in (total, avail, limit) if v]
    return Memory(min(known) if known else None, total, avail, limit, where)


def usable_memory() -> int | None:
    """Bytes this process can still use (MemAvailable, cgroup limit); None if unknown."""
    return memory().usable


def cpu_quota(proc: Path = PROC, cgroup: Path = CGROUP) -> float | None:
    """The tightest cgroup CPU quota along this process's cgroup path, in CPUs; None if none."""
    best: float | None = None
    for file in _cgroup_files(proc, cgroup, "cpu", ("cpu.max",), ("cpu.cfs_quota_us",)):
        q = _quota(file)
        if q is not None and (best is None or q < best):
            best = q
    return best


def _quota(file: Path) -> float | None:
    try:
        text = file.read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        if file.name == "cpu.max":  # "max 100000" or "QUOTA PERIOD"
            if not text or text[0] == "max":
                return None
            quota, period = int(text[0]), int(text[1]) if len(text) > 1 else 100_000
        else:  # v1: cpu.cfs_quota_us (-1: none) beside cpu.cfs_period_us
            quota = int(text[0])
            period = _read_int(file.with_name("cpu.cfs_period_us")) or 100_000
    except (ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_files(proc: Path, cgroup: Path, controller: str, v2_names: tuple[str, ...],
                  v1_names: tuple[str, ...]) -> Iterator[Path]:
    """Limit files of `controller` for this process's cgroup and each ancestor up to the root.
    Missing files are skipped, so a path that the mount namespace hides still reaches the
    limits that are visible."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrls, rel = parts
        if hier == "0" and not ctrls:  # v2 (unified; hybrid: under unified/)
            base = cgroup if (cgroup / "cgroup.controllers").exists() else cgroup / "unified"
            names = v2_names
        elif controller in ctrls.split(","):
            base = cgroup / ctrls if (cgroup / ctrls).is_dir() else cgroup / controller
            names = v1_names
        else:
            continue
        for d in _up(base, rel):
            for name in names:
                if (d / name).is_file():
                    yield d / name


def _up(base: Path, rel: str) -> Iterator[Path]:
    parts = [p for p in rel.split("/") if p and p not in (".", "..")]
    for n in range(len(parts), -1, -1):
        yield base.joinpath(*parts[:n])


def _meminfo(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    except (OSError, UnicodeDecodeError):
        pass
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return None
