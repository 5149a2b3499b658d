"""Free-space verdicts shared by hub and torrent dry runs."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# Headroom on top of what a download needs: filesystems report free blocks, not what a file of
# that size will actually get (metadata, reserved blocks), and partial downloads add slack.
SAFETY_MARGIN = 0.05


@dataclass(frozen=True)
class SpaceNeed:
    """Bytes still to be written on one filesystem (identified by a path on it)."""

    label: str
    path: Path
    need: int


@dataclass(frozen=True)
class SpaceVerdict:
    label: str
    path: Path
    need: int
    need_with_margin: int
    free: int

    @property
    def ok(self) -> bool:
        return self.free >= self.need_with_margin


def existing_parent(path: Path) -> Path:
    """The nearest existing directory at or above `path` (the destination may not exist yet)."""
    p = path.absolute()
    while not p.exists():
        p = p.parent
    return p if p.is_dir() else p.parent


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing_parent(path)).free


def with_margin(n: int) -> int:
    return n + (n * int(SAFETY_MARGIN * 100) + 99) // 100


def verdicts(needs: list[SpaceNeed]) -> list[SpaceVerdict]:
    """One verdict per filesystem: needs on the same device are added up before comparing."""
    by_dev: dict[int, list[SpaceNeed]] = {}
    for n in needs:
        by_dev.setdefault(os.stat(existing_parent(n.path)).st_dev, []).append(n)
    out = []
    for group in by_dev.values():
        total = sum(n.need for n in group)
        label = " + ".join(n.label for n in group)
        where = group[0].path
        out.append(SpaceVerdict(label, where, total, with_margin(total), free_bytes(where)))
    return out
