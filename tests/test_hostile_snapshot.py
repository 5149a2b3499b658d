"""The hostile-input tests' helpers (tests/hostile_snapshot.py) checked themselves."""

from __future__ import annotations

import os
from pathlib import Path

from hostile_snapshot import BLOBS, changes, rename_blob, snapshot


def test_snapshot_sees_content_links_folders_and_mtimes(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "l").symlink_to("d/f")
    (tmp_path / "dest").mkdir()
    before = snapshot(tmp_path, tmp_path / "dest")
    assert before["l"][:2] == ("link", "d/f") and before["d"] == ("dir",)
    (tmp_path / "dest" / "new").write_bytes(b"inside the destination: not seen")
    assert snapshot(tmp_path, tmp_path / "dest") == before
    (tmp_path / "d" / "f").write_bytes(b"y")
    assert changes(before, snapshot(tmp_path, tmp_path / "dest")) == {"d/f"}
    (tmp_path / "d" / "f").write_bytes(b"x")        # same bytes again: only the mtime differs
    os.utime(tmp_path / "d" / "f", ns=(1, 1))
    assert changes(before, snapshot(tmp_path, tmp_path / "dest")) == {"d/f"}
    assert snapshot(tmp_path, tmp_path / "dest", mtimes=False) == \
        snapshot(tmp_path, tmp_path / "dest", mtimes=False)


def test_rename_blob_keeps_the_file_sealed(tmp_path: Path) -> None:
    from moepack.format import Container

    path = tmp_path / "renamed.moepack"
    path.write_bytes(rename_blob(BLOBS.read_bytes(), "tokenizer.json", "tok.json"))
    with Container.open(path) as c:
        assert "tok.json" in c.blob_names() and "tokenizer.json" not in c.blob_names()
