"""Hostile torrents, planted links, a full disk and bad paths against `moepack fetch`,
`moepack torrent create` (issue 13). Real libtorrent sessions on 127.0.0.1 only.

Each case checks the one-line message and exit code, that no traceback shows, and that nothing
outside the destination was created, changed or lost (hostile_snapshot.snapshot).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import libtorrent as lt
import pytest
from hostile_snapshot import assert_one_line_error, cli, error_line, moepack, snapshot
from moepack.fetch import space
from moepack.fetch.staging import STAGING_DIR
from moepack.fetch.torrent import create_torrent, seed_in_background, write_torrent
from moepack.fetch.torrent_source import describe, parse_torrent
from moepack.format.synthetic import mixtral_spec, write_synthetic

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]

NO_PEER = "127.0.0.1:9"   # discard port: nothing answers, and the session stays on loopback


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A ~0.5 MB container, its torrent and the staging key (info-hash)."""
    d = tmp_path_factory.mktemp("small")
    path = d / "tiny.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=8, hidden=128, inter=64))
    torrent = d / "tiny.torrent"
    write_torrent(create_torrent(path), torrent)
    return path, torrent, describe(parse_torrent(torrent.read_bytes(), "t").ti, "t").info_hash


def _fetch(torrent: Path, dest: Path, *peers: str) -> tuple[int, str]:
    args: list[str | Path] = ["fetch", torrent, "--dest", dest, "--listen", "127.0.0.1:0",
                              "--stall-timeout", "20"]
    for p in peers or (NO_PEER,):
        args += ["--peer", p]
    return cli(*args)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    p = tmp_path / "victim.bin"
    p.write_bytes(b"precious bytes, not to be touched\n")
    return p


# -- planted links in staging ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["staging root", "staging folder", "staged file"])
def test_links_in_staging_are_refused(small, tmp_path: Path, victim: Path, where: str) -> None:
    path, torrent, key = small
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs").write_bytes(b"theirs")
    root = dest / STAGING_DIR
    if where == "staging root":
        dest.mkdir()
        root.symlink_to(elsewhere)
        shown = f"{root} is a symbolic link"
    elif where == "staging folder":
        root.mkdir(parents=True)
        (root / key).symlink_to(elsewhere)
        shown = f"{root / key} is a symbolic link"
    else:
        (root / key).mkdir(parents=True)
        (root / key / path.name).symlink_to(victim)
        shown = f"{root / key / path.name} is a symbolic link"
    before = snapshot(tmp_path, dest)
    rc, out = _fetch(torrent, dest)
    assert rc == 1 and shown in error_line(out), out
    assert snapshot(tmp_path, dest) == before
    assert not (dest / path.name).exists()


def test_link_at_the_final_name_is_refused(small, tmp_path: Path) -> None:
    """A damaged copy behind a link: repair would move the link into staging and libtorrent
    would write the missing pieces through it."""
    path, torrent, _ = small
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    (elsewhere / path.name).write_bytes(bytes(data))
    (dest / path.name).symlink_to(elsewhere / path.name)
    before = snapshot(tmp_path, dest)
    rc, out = _fetch(torrent, dest)
    assert rc == 1 and "is a symbolic link; not touching it" in error_line(out), out
    assert snapshot(tmp_path, dest) == before
    assert (dest / path.name).is_symlink()


def test_links_at_resume_files_are_replaced_not_followed(small, tmp_path: Path,
                                                         victim: Path) -> None:
    path, torrent, key = small
    dest = tmp_path / "dest"
    stage = dest / STAGING_DIR / key
    stage.mkdir(parents=True)
    (stage / "resume.dat").symlink_to(victim)
    (stage / "resume.tmp").symlink_to(victim)
    before = snapshot(tmp_path, dest)
    with seed_in_background(torrent, path) as seeder:
        rc, out = _fetch(torrent, dest, f"127.0.0.1:{seeder.port}")
    assert rc == 0, out
    assert snapshot(tmp_path, dest) == before
    assert (dest / path.name).read_bytes() == path.read_bytes()


# -- crafted torrents --------------------------------------------------------------------------

def _torrent(tmp_path: Path, info: dict) -> Path:
    base = {b"piece length": 16384, b"pieces": b"\x00" * 20 * 7}
    if b"files" not in info:
        base[b"length"] = 100_000
    t = tmp_path / "crafted.torrent"
    t.write_bytes(lt.bencode({b"info": {**base, **info}}))
    return t


@pytest.mark.parametrize("info,needle", [
    ({b"name": b".moepack-partial"}, "unusable file name '.moepack-partial': starts with '.'"),
    ({b"name": b".."}, "malformed torrent"),
    ({b"name": b"a", b"pieces": b"\x00" * 20,
      b"files": [{b"length": 1, b"path": [b"x"]}, {b"length": 1, b"path": [b"y"]}]},
     "holds 2 files"),
    ({b"name": b"a", b"moepack id": b"\x1b[2J" + b"0" * 60}, "malformed container ID '\\x1b[2J"),
])
def test_crafted_torrents_are_one_line(tmp_path: Path, info: dict, needle: str) -> None:
    t = _torrent(tmp_path, info)
    dest = tmp_path / "dest"
    before = snapshot(tmp_path, dest)
    rc, out = cli("fetch", t, "--dest", dest, "--dry-run")
    assert_one_line_error(rc, out, 1, needle)
    assert "\x1b" not in out
    assert snapshot(tmp_path, dest) == before and not dest.exists()


# -- disk full ---------------------------------------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 1 MiB tmpfs (root only; skipped with the reason otherwise)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs for the disk-full case: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_during_a_torrent_fetch_is_one_line(tmp_path: Path, tiny_fs: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The free-space check is fooled (as when another writer fills the disk meanwhile): the
    full disk shows as one error line, the resume writer adds no second traceback, and the
    staged bytes stay for a rerun."""
    src = tmp_path / "src"
    src.mkdir()
    path = src / "mid.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=16, hidden=256, inter=128))
    assert path.stat().st_size > 3 << 19, "well beyond the 1 MiB file system"
    torrent = src / "mid.torrent"
    write_torrent(create_torrent(path), torrent)
    monkeypatch.setattr(space, "free_bytes", lambda p: 1 << 40)
    dest = tiny_fs / "dest"
    before = snapshot(tmp_path, tiny_fs)
    with seed_in_background(torrent, path) as seeder:
        rc, out = _fetch(torrent, dest, f"127.0.0.1:{seeder.port}")
    line = error_line(out)
    assert rc == 1 and "No space left on device" in line, out
    assert "file_write" in line and "resume" not in line, "the first error, not the resume one"
    assert snapshot(tmp_path, tiny_fs) == before
    assert not (dest / path.name).exists(), "an unverified file never gets the final name"


def test_resume_data_that_cannot_be_saved_after_the_last_piece_is_no_error(
        small, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills after the last piece arrived: the resume data (only a shortcut for a
    rerun) cannot be saved, and the complete, verified container is still published, exit 0;
    it used to fail with 'cannot save resume data' and leave the container unpublished."""
    from moepack.fetch.errors import FetchError
    from moepack.fetch.staging import Staging

    path, torrent, _ = small

    def full(self: Staging, data: bytes) -> None:
        raise FetchError(f"cannot save resume data in {self.dir}: No space left on device")

    monkeypatch.setattr(Staging, "write_resume", full)
    dest = tmp_path / "dest"
    with seed_in_background(torrent, path) as seeder:
        rc, out = _fetch(torrent, dest, f"127.0.0.1:{seeder.port}")
    assert rc == 0, out
    assert (dest / path.name).read_bytes() == path.read_bytes()
    assert not (dest / STAGING_DIR).exists()


# -- paths -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing folder", "a folder"])
def test_torrent_create_output_is_checked_first(small, tmp_path: Path, case: str) -> None:
    path, _, _ = small
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(path, work / path.name)
    if case == "missing folder":
        out, needle = work / "nope" / "x.torrent", f"folder {work / 'nope'} does not exist"
    else:
        out, needle = work, f"{work} is a folder"
    before = snapshot(tmp_path)
    rc, text = moepack("torrent", "create", work / path.name, "-o", out)
    assert_one_line_error(rc, text, 1, needle)
    assert snapshot(tmp_path) == before


def test_undecodable_dest_is_one_line(small, tmp_path: Path) -> None:
    _, torrent, _ = small
    dest = bytes(tmp_path) + b"/d\xff\xfe"
    before = snapshot(tmp_path)
    r = subprocess.run([*moepack_argv(), "fetch", str(torrent), "--dest", dest, "--dry-run"],
                       capture_output=True, timeout=60)
    out = (r.stdout + r.stderr).decode("utf-8", "replace")
    assert_one_line_error(r.returncode, out, 1, "--dest")
    assert "not valid UTF-8" in out and "\\udcff\\udcfe" in out, out
    assert snapshot(tmp_path) == before


def moepack_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "moepack"]
