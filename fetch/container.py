"""What fetch needs from a container: its ID before a transfer, a full verification after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moepack.fetch.errors import FetchError


def read_container_id(path: Path) -> tuple[str, int]:
    """(container ID, alignment) from the header and index; FetchError if not a container."""
    from moepack.format import FormatError
    from moepack.format.reader import Container

    try:
        with Container.open(path) as c:
            return c.id, c.alignment
    except FormatError as e:
        raise FetchError(f"{path}: {e.with_code()}") from e


def peek_container_id(path: Path) -> str | None:
    """The ID a file claims, or None when its header or index is unreadable (damaged or foreign)."""
    try:
        return read_container_id(path)[0]
    except (FetchError, OSError):
        return None


def header_claim(path: Path) -> str | None:
    """The ID an intact header names (its own hash checks), whatever the file's size: a
    truncated or appended copy still says which container it was. None otherwise."""
    from moepack.verify.opening import header_claim as claim

    return claim(path)


@dataclass(frozen=True)
class Checked:
    ok: bool
    container_id: str | None
    problem: str | None   # first damage or "not verifiable" reason (with its code), for messages


def check_container(path: Path, *, quick: bool = False) -> Checked:
    """moepack.verify on `path`, reduced to what fetch and seed decide on."""
    from moepack.verify import verify

    report = verify(path, quick=quick)
    if report.ok:
        return Checked(True, report.container_id, None)
    if report.error:
        code = f" [{report.error_code}]" if report.error_code else ""
        return Checked(False, report.container_id, report.error + code)
    d = report.damaged[0] if report.damaged else None
    if d is None:
        return Checked(False, report.container_id, "damaged")
    what = f"{len(report.damaged)} damaged item(s), first {d.label} at offset {d.offset}"
    return Checked(False, report.container_id, what)
