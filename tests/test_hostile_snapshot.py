"""Helpers of the hostile-input tests: run the real CLI, snapshot a folder tree (links not
followed) and build resealed containers. The tests at the bottom check the helpers themselves."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from test_vectors import VECTORS, load_generator

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


def assert_one_line_error(rc: int, output: str, code: int, needle: str) -> None:
    """Exit `code`, `needle` in the output, one line, no traceback."""
    assert rc == code, output
    assert "Traceback" not in output, output
    assert needle in output, output
    assert len(output.strip().splitlines()) == 1, output


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, links not followed: kind and size, content hash or link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", st.st_size, hashlib.sha256(p.read_bytes()).hexdigest())
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


def test_snapshot_sees_content_links_and_folders(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "l").symlink_to("d/f")
    before = snapshot(tmp_path)
    assert before["l"] == ("link", "d/f") and before["d"] == ("dir",)
    (tmp_path / "d" / "f").write_bytes(b"y")
    assert changes(before, snapshot(tmp_path)) == {"d/f"}


def test_rename_blob_keeps_the_file_sealed(tmp_path: Path) -> None:
    from moepack.format import Container

    path = tmp_path / "renamed.moepack"
    path.write_bytes(rename_blob(BLOBS.read_bytes(), "tokenizer.json", "tok.json"))
    with Container.open(path) as c:
        assert "tok.json" in c.blob_names() and "tokenizer.json" not in c.blob_names()
