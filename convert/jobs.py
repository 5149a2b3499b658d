"""The default `--jobs`: usable cores (affinity, cgroup CPU quota), bounded by memory."""

from __future__ import annotations

from dataclasses import dataclass

from moepack import sysinfo


@dataclass(frozen=True)
class JobsChoice:
    jobs: int
    cores: int                    # usable cores (moepack.sysinfo)
    memory_allows: int | None     # workers whose estimated peak fits in usable memory
    auto: bool                    # chosen here (no --jobs given)

    def describe(self) -> str:
        mem = "memory unknown" if self.memory_allows is None else \
            f"memory allows {self.memory_allows}"
        how = "" if self.auto else ", from --jobs"
        return f"jobs: {self.jobs} ({self.cores} usable cores, {mem}{how})"


def choose_jobs(requested: int | None, per_worker_bytes: int,
                cores: int | None = None, memory: int | None = None) -> JobsChoice:
    """`requested` (--jobs) as is, or else min(usable cores, usable memory // per-worker peak),
    at least 1. `cores` and `memory` default to this machine's (tests pass their own)."""
    n_cores = cores if cores is not None else sysinfo.usable_cores()
    mem = memory if memory is not None else sysinfo.usable_memory()
    allows = None if mem is None else mem // max(1, per_worker_bytes)
    if requested is not None:
        return JobsChoice(requested, n_cores, allows, auto=False)
    jobs = n_cores if allows is None else min(n_cores, allows)
    return JobsChoice(max(1, jobs), n_cores, allows, auto=True)
