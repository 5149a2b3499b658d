"""`moepack convert` when resources run out: a disk that fills midway (the journal or the
partial cannot grow), RLIMIT_FSIZE (EFBIG), too many open files at worker start. Each is one
line naming the file (or the limit), an existing OUT survives, and a rerun after the fault
resumes to the same bytes as an uninterrupted run."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_snapshot import cli, error_line
from moepack.convert import journal as journal_mod
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from tiny_models import make_checkpoint

FAST = Settings(expert_preset="rvq3-baseline", iters=3)
FAST_ARGS = ("--expert-codec", "rvq3-baseline", "--iters", "3", "--jobs", "1", "-q")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_checkpoint("mixtral", tmp_path_factory.mktemp("exhaust-src") / "mixtral")


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("exhaust-ref") / "ref.moepack"
    convert(src, out, FAST)
    return out.read_bytes()


def _sib(out: Path, suffix: str) -> Path:
    return out.with_name(out.name + suffix)


def _full_after(monkeypatch: pytest.MonkeyPatch, suffix: str, writes: int) -> None:
    """os.write to a file named *suffix fails with ENOSPC after `writes` successful ones (the
    disk filled up after the free-space check: another process took the room)."""
    real = os.write
    seen = [0]

    def write(fd: int, data) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(suffix):
            seen[0] += 1
            if seen[0] > writes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(journal_mod.os, "write", write)


def test_journal_on_a_disk_that_fills_midway_names_it_and_resumes(src, reference, tmp_path,
                                                                  monkeypatch) -> None:
    out = tmp_path / "m.moepack"
    out.write_bytes(b"the user's earlier container")
    with monkeypatch.context() as m:
        _full_after(m, ".journal", 3)
        rc, output = cli("convert", *FAST_ARGS, "--force", src, out)
    assert rc == 1, output
    line = error_line(output)
    assert "No space left on device" in line and str(_sib(out, ".journal")) in line, line
    assert out.read_bytes() == b"the user's earlier container"   # a failed overwrite keeps it
    assert _sib(out, ".partial").exists() and _sib(out, ".journal").exists()
    rc, output = cli("convert", *FAST_ARGS, "--force", src, out)
    assert rc == 0, output
    assert out.read_bytes() == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.moepack"]


def test_partial_write_on_a_full_disk_names_the_partial(src, reference, tmp_path,
                                                         monkeypatch) -> None:
    """A filesystem without fallocate fills while the workers write: the pwrite fails."""
    import moepack.format.writer as writer

    real = os.pwrite
    calls = [0]

    def pwrite(fd: int, data, offset: int) -> int:
        calls[0] += 1
        if calls[0] > 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    out = tmp_path / "m.moepack"
    with monkeypatch.context() as m:
        m.setattr(writer.os, "pwrite", pwrite)
        rc, output = cli("convert", *FAST_ARGS, src, out)
    assert rc == 1, output
    assert f"No space left on device: '{_sib(out, '.partial')}'" in error_line(output)
    rc, output = cli("convert", *FAST_ARGS, src, out)
    assert rc == 0, output
    assert out.read_bytes() == reference


def test_file_size_limit_is_one_line_naming_the_partial(src, tmp_path) -> None:
    """RLIMIT_FSIZE (EFBIG; Python ignores SIGXFSZ) below the container's size: the
    preallocation fails at once, naming the file, and nothing is left beside OUT."""
    import resource

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    out = tmp_path / "m.moepack"
    r = subprocess.run([sys.executable, "-m", "moepack", "convert", *FAST_ARGS, str(src),
                        str(out)], preexec_fn=small_files, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: [Errno 27] File too large: '{_sib(out, '.partial')}'"], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_too_many_open_files_at_worker_start_is_one_line_and_resumes(src, reference, tmp_path,
                                                                      monkeypatch) -> None:
    """EMFILE while starting the --jobs 2 workers (the second one's pipe): one line naming the
    limit and what to do, not the bare errno text; the rerun continues to the same bytes."""
    import multiprocessing.connection as mpc

    real = mpc.Pipe
    calls = [0]

    def pipe(duplex: bool = True):
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(duplex)

    out = tmp_path / "m.moepack"
    args = ("--expert-codec", "rvq3-baseline", "--iters", "3", "-q", "--jobs", "2")
    with monkeypatch.context() as m:
        m.setattr(mpc, "Pipe", pipe)
        rc, output = cli("convert", *args, src, out)
    assert rc == 1, output
    line = error_line(output)
    assert line.startswith("error: cannot start 2 worker processes: too many open files "
                           "(ulimit -n is "), line
    assert "pass fewer --jobs" in line
    rc, output = cli("convert", *args, src, out)
    assert rc == 0, output
    assert out.read_bytes() == reference
