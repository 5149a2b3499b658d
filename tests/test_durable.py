"""moepack.durable.fsync_path: the one fsync-by-path helper of the converter and the downloader."""

from __future__ import annotations

import os

import pytest

from moepack.durable import fsync_path


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fsync_path_file_and_directory_without_leaking(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 100)
    n = _open_fds()
    fsync_path(f)
    fsync_path(tmp_path)  # a directory: makes a rename in it durable
    fsync_path(str(f))
    with pytest.raises(FileNotFoundError):
        fsync_path(tmp_path / "missing")
    assert _open_fds() == n


def test_converter_and_downloader_share_it():
    from moepack.convert import pipeline
    from moepack.fetch import staging

    assert pipeline.fsync_path is fsync_path and staging.fsync_path is fsync_path
    assert not hasattr(pipeline, "_fsync") and not hasattr(staging, "_fsync_dir")
