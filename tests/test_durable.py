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


def test_naming_gives_a_descriptor_error_its_file(tmp_path):
    """os.write and os.fsync on a descriptor name no file: a full disk would be the bare
    `[Errno 28] No space left on device`; naming() says where, errno and class kept."""
    import errno

    from moepack.durable import naming

    with pytest.raises(OSError) as got, naming(tmp_path / "f"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert got.value.errno == errno.ENOSPC and got.value.filename == str(tmp_path / "f")
    assert str(got.value) == f"[Errno 28] No space left on device: '{tmp_path / 'f'}'"
    with pytest.raises(PermissionError) as got, naming(tmp_path / "f"):
        raise OSError(errno.EACCES, "Permission denied")   # the class follows the errno
    with pytest.raises(FileNotFoundError) as got, naming(tmp_path / "f"):
        open(tmp_path / "other")   # already named: left as it is
    assert got.value.filename == str(tmp_path / "other")


def test_write_file_on_a_full_disk_leaves_no_file(tmp_path):
    """A .tmp that could not be written (the manifest's, the hub record's) is removed, not left
    half-written beside the name it was to replace; the error names it. RLIMIT_FSIZE (this
    process's soft limit, for the one call) stands in for the full disk."""
    import resource

    from moepack import safefs

    target = tmp_path / "moepack-source.json.tmp"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16, hard))
    try:
        with pytest.raises(OSError, match="File too large: .*moepack-source.json.tmp"):
            safefs.write_file(target, b"x" * 100_000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("blocks", [False, True])
def test_reserve_where_fallocate_is_unsupported(tmp_path, monkeypatch, blocks):
    """The file gets its size and keeps its head; with blocks=True the rest is written as zeros
    (no holes a mapping could fault on), else it is extended with holes."""
    import errno

    from moepack.durable import reserve

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    p = tmp_path / "f"
    p.write_bytes(b"head")
    fd = os.open(p, os.O_RDWR)
    try:
        reserve(fd, 3 << 20, blocks=blocks)
    finally:
        os.close(fd)
    assert p.stat().st_size == 3 << 20 and p.read_bytes()[:4] == b"head"
    allocated = p.stat().st_blocks * 512
    assert (allocated >= 3 << 20) if blocks else (allocated < 1 << 20)
