"""Helpers of the hostile-input tests: run the real CLI, snapshot a folder tree (links not
followed) and build resealed containers (checked themselves in tests/test_hostile_snapshot.py)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from spec_vectors import VECTORS, load_generator

gen = load_generator()
BLOBS = VECTORS / "valid" / "blobs.moepack"  # exports as is: a Mixtral config, three blobs


def moepack(*args: str | os.PathLike, timeout: float = 60) -> tuple[int, str]:
    """Run `python -m moepack ARGS`; (exit code, stdout + stderr)."""
    r = subprocess.run([sys.executable, "-m", "moepack", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "COLUMNS": "400"})
    return r.returncode, r.stdout + r.stderr


def cli(*args: str | os.PathLike) -> tuple[int, str]:
    """The same CLI in this process (fast; monkeypatch reaches it): (exit code, output). An
    exception other than the exit itself is what a user would see as a traceback."""
    from typer.testing import CliRunner

    from moepack.cli import app

    result = CliRunner().invoke(app, list(map(str, args)))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return 99, f"Traceback: {result.exception!r}\n{result.output}"
    return result.exit_code, result.output


def only_line(output: str) -> str:
    """The output's only line, asserting there is exactly one and no traceback."""
    assert "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


def error_line(output: str) -> str:
    """The one `error:` line (a progress bar may precede it); fails unless exactly one."""
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def assert_one_line_error(rc: int, output: str, code: int, needle: str) -> None:
    """Exit `code`, `needle` in the output, one line, no traceback."""
    assert rc == code, output
    assert needle in only_line(output), output


def snapshot(root: Path, skip: Path | None = None, *, mtimes: bool = True) -> dict[str, tuple]:
    """Every entry under `root` except the subtree `skip` (a destination a command may fill),
    links not followed: files by size, mtime and content hash, links by target and mtime,
    folders by name (a new or lost entry shows as a name), anything else by its kind. The one
    snapshot of the hostile tests: compare before and after to show nothing was created,
    changed or lost. `mtimes=False` compares content only (a file rewritten with equal bytes)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            p = here / name
            if p == skip:
                continue
            st = os.lstat(p)
            mtime = (st.st_mtime_ns,) if mtimes else ()
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p), *mtime)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", st.st_size, *mtime, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
    return out


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> set[str]:
    """Paths added, removed or changed between two snapshots."""
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def rename_blob(data: bytes, old: str, new: str) -> bytes:
    """`data` with blob `old` renamed `new`, resealed: header hash and root hash (the container
    ID) agree with the new index, so only the name rule can refuse it."""
    doc = gen.index_doc(data)
    gen.section(doc, old)["name"] = new
    return gen.reseal(data, doc)
