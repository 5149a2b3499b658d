"""Two runs on the same output at once: the second says which run holds it and what to do, in
one line; the first's output is never touched, and nothing half-written is published."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from moepack.convert.errors import ConvertError
from moepack.convert.journal import Journal
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from tiny_models import make_checkpoint

FAST = Settings(expert_preset="rvq3-baseline", iters=3)
CLI_FAST = ("--expert-codec", "rvq3-baseline", "--iters", "3", "--quiet")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return make_checkpoint("mixtral", tmp_path_factory.mktemp("cc-src") / "mixtral")


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("cc-ref") / "ref.moepack"
    convert(source, out, FAST)
    return out.read_bytes()


def _moepack(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "moepack", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"finished before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.02)


def test_convert_while_another_runs_names_it_even_with_other_settings(source, reference,
                                                                      tmp_path):
    """Before: a second run with other settings said the partial 'was started with different
    settings ... pass --restart to discard it', advice aimed at the live run's work."""
    out = tmp_path / "o.moepack"
    journal = tmp_path / "o.moepack.journal"
    first = _moepack("convert", str(source), str(out), *CLI_FAST, "--jobs", "2",
                     "--pause-per-unit", "0.2")
    try:
        _wait_for(lambda: journal.exists() and journal.read_bytes().count(b"\n") >= 3, first,
                  "3 journaled units")
        for extra in (("--seed", "7"), ("--seed", "7", "--restart"), ("--force",), ()):
            second = subprocess.run([sys.executable, "-m", "moepack", "convert", str(source),
                                     str(out), *CLI_FAST, *extra], capture_output=True,
                                    text=True, timeout=120)
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 1 and len(lines) == 1, (extra, second.stderr)
            assert re.search(rf"another conversion of this output is running \(process "
                             rf"{first.pid} holds", lines[0]), lines[0]
            assert "wait for it to finish" in lines[0]
            assert first.poll() is None, "the first run ended before the check was over"
        assert first.wait(timeout=120) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert out.read_bytes() == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.moepack"]


def test_convert_with_other_settings_while_journal_is_held(source, tmp_path):
    out = tmp_path / "h.moepack"
    jpath = tmp_path / "h.moepack.journal"
    holder = Journal.create(jpath, {"settings": {"seed": 0}})
    (tmp_path / "h.moepack.partial").write_bytes(b"\0" * 64)
    try:
        with pytest.raises(ConvertError, match=rf"process {os.getpid()} holds this journal"):
            convert(source, out, Settings(expert_preset="rvq3-baseline", iters=3, seed=7))
    finally:
        holder.close()


def test_journal_removed_by_a_finishing_run_is_never_the_one_locked(tmp_path, monkeypatch):
    """A run that opens the journal just as the previous run removes it must not lock (and
    write to) the removed file: a third run would then find no journal and start a partial of
    its own beside it. Before: remove() closed (unlocking) and then unlinked."""
    path = tmp_path / "x.journal"
    finishing = Journal.create(path, {"n": 1})
    real_open = Journal._open_or_create
    calls = []

    def open_then_previous_finishes(p: Path) -> int:
        fd = real_open(p)
        if not calls:
            calls.append(fd)
            finishing.remove()  # the earlier run finishes between our open and our lock
        return fd

    monkeypatch.setattr(Journal, "_open_or_create", staticmethod(open_then_previous_finishes))
    starting = Journal.create(path, {"n": 2})
    try:
        assert path.exists(), "the starting run holds a journal no longer at its name"
        assert os.path.samestat(os.fstat(starting._fd), os.stat(path))
        assert Journal.read_header(path)["n"] == 2
        with pytest.raises(ConvertError, match="another conversion"):
            Journal.resume(path)
    finally:
        starting.close()


_SLOW_EXPORT = """
import sys, time
from moepack.convert.export import export
export(sys.argv[1], sys.argv[2], force=True, on_tensor=lambda n: time.sleep(0.1))
"""


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_export_into_a_folder_another_export_is_building(reference, tmp_path):
    """Before: the second export called the running one's OUTDIR.partial 'left by an earlier
    export; pass --force to remove it', and with --force removed it under the first, which
    died with a traceback (FileNotFoundError) or published a folder of both."""
    from moepack.convert.export import export

    container = tmp_path / "m.moepack"
    container.write_bytes(reference)
    clean = tmp_path / "clean"
    export(container, clean)
    out, tmp = tmp_path / "hf", tmp_path / "hf.partial"
    export(container, out)  # an earlier export, replaced by the slow one
    first = subprocess.Popen([sys.executable, "-c", _SLOW_EXPORT, str(container), str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (tmp / ".moepack-export.json").exists(), first, "OUTDIR.partial")
        for extra in ((), ("--force",)):
            second = subprocess.run([sys.executable, "-m", "moepack", "export", str(container),
                                     str(out), *extra], capture_output=True, text=True,
                                    timeout=120)
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 1 and len(lines) == 1, (extra, second.stderr)
            assert re.search(rf"another moepack export into this folder is running \(process "
                             rf"{first.pid} holds hf.partial\)", lines[0]), lines[0]
            assert first.poll() is None, "the first export ended before the check was over"
        assert first.wait(timeout=120) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert _tree(out) == _tree(clean)
    assert not tmp.exists() and not (tmp_path / "hf.old").exists()


def test_seed_stops_when_its_file_is_replaced(tmp_path):
    """convert --force (or a fetch) renames a new file onto the one being seeded. Before: seed
    went on without a word, libtorrent serving the new file's bytes under the old torrent
    (pieces failing their check, fetchers stalling). Now it stops, exit 1, one line; the same
    container written again is seeded on."""
    import shutil

    from moepack.format.synthetic import mixtral_spec, write_synthetic
    from torrent_loopback import small_torrent

    path, torrent, _ = small_torrent(tmp_path)
    seed = _moepack("seed", str(torrent), "--path", str(path), "--listen", "127.0.0.1:0")
    try:
        time.sleep(3.0)  # started and seeding
        assert seed.poll() is None, seed.communicate()
        same = tmp_path / "same.tmp"
        shutil.copyfile(path, same)
        os.replace(same, path)  # the same container again: seeding goes on
        time.sleep(2.5)
        assert seed.poll() is None, seed.communicate()
        other = tmp_path / "other.tmp"
        write_synthetic(other, mixtral_spec(layers=3, experts=8, hidden=128, inter=64))
        os.replace(other, path)
        out, err = seed.communicate(timeout=30)
    finally:
        if seed.poll() is None:
            seed.kill()
            seed.wait()
    lines = err.strip().splitlines()
    assert seed.returncode == 1 and len(lines) == 1, (out, err)
    assert "was replaced by another file while seeding" in lines[0], lines[0]
