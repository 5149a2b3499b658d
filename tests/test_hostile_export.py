"""`moepack export` and the folders around OUTDIR: nothing is deleted unless asked (--force), and
then only folders export made itself (its marker, nothing else inside); a link planted at OUTDIR,
OUTDIR.partial or OUTDIR.old is neither followed nor removed; blob names never leave OUTDIR even
if a reader let one through."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hostile_snapshot import (
    BLOBS,
    assert_one_line_error,
    changes,
    cli,
    gen,
    moepack,
    rename_blob,
    snapshot,
)
from moepack.convert import export as export_mod
from moepack.convert.export import MARKER, export
from moepack.format import Container, FormatError

from moepack.safefs import UnsafePathError

FOREIGN = "was not made by moepack export"


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path]:
    """(container, OUTDIR) inside tmp_path, which the tests snapshot."""
    path = tmp_path / "c.moepack"
    shutil.copy(BLOBS, path)
    return path, tmp_path / "out"


def _sib(out: Path, suffix: str) -> Path:
    return out.with_name(out.name + suffix)


def _refused_both_ways(path: Path, out: Path, needle: str) -> None:
    """Refused with and without --force, one line each, and nothing under the parent changes."""
    root = out.parent
    before = snapshot(root)
    for force in ([], ["--force"]):
        rc, output = cli("export", *force, path, out)
        assert_one_line_error(rc, output, 1, needle)
    assert changes(before, snapshot(root)) == set()


@pytest.mark.parametrize("suffix", [".partial", ".old"])
def test_foreign_leftover_folder_survives_even_force(site, suffix: str) -> None:
    path, out = site
    folder = _sib(out, suffix)
    folder.mkdir()
    (folder / "notes.txt").write_bytes(b"mine")
    _refused_both_ways(path, out, FOREIGN)
    assert (folder / "notes.txt").read_bytes() == b"mine"


@pytest.mark.parametrize("suffix", ["", ".partial", ".old"])
@pytest.mark.parametrize("target", ["folder", "file", "dangling"])
def test_planted_link_is_neither_followed_nor_removed(site, suffix: str, target: str) -> None:
    path, out = site
    elsewhere = out.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"keep")
    dest = {"folder": elsewhere, "file": elsewhere / "precious",
            "dangling": elsewhere / "missing"}[target]
    _sib(out, suffix).symlink_to(dest)
    _refused_both_ways(path, out, "is a symbolic link")
    assert (elsewhere / "precious").read_bytes() == b"keep"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]


def test_foreign_outdir_survives_even_force(site) -> None:
    path, out = site
    out.mkdir()
    (out / "weights.bin").write_bytes(b"user data")
    _refused_both_ways(path, out, FOREIGN)


def test_outdir_that_is_a_file_is_refused(site) -> None:
    path, out = site
    out.write_bytes(b"a file")
    _refused_both_ways(path, out, "is not a folder")


def test_force_replaces_an_earlier_export_and_nothing_else(site) -> None:
    path, out = site
    assert moepack("export", path, out)[0] == 0
    assert (out / MARKER).is_file()
    rc, output = moepack("export", path, out)
    assert_one_line_error(rc, output, 1, "not empty; pass --force")
    before = snapshot(out.parent, mtimes=False)
    rc, output = moepack("export", "--force", path, out)
    assert rc == 0, output
    after = snapshot(out.parent, mtimes=False)
    assert after == before  # same container, same bytes; no .partial or .old left over


def test_force_keeps_a_file_the_user_added_to_an_export(site) -> None:
    path, out = site
    assert moepack("export", path, out)[0] == 0
    (out / "my-notes.txt").write_bytes(b"notes")
    _refused_both_ways(path, out, "'my-notes.txt' is not one of its files")


def test_export_in_a_subfolder_is_not_ours(site) -> None:
    path, out = site
    assert moepack("export", path, out)[0] == 0
    (out / "sub").mkdir()
    _refused_both_ways(path, out, "'sub' is not one of its files")


@pytest.mark.parametrize("suffix", [".partial", ".old"])
def test_leftover_of_an_earlier_export_needs_force(site, suffix: str) -> None:
    """A folder export made (killed before the rename, or crashed before removing .old) is
    removed with --force only."""
    path, out = site
    scratch = out.parent / "scratch"
    assert moepack("export", path, scratch)[0] == 0
    scratch.rename(_sib(out, suffix))
    before = snapshot(out.parent)
    rc, output = moepack("export", path, out)
    assert_one_line_error(rc, output, 1, "left by an earlier export; pass --force")
    assert changes(before, snapshot(out.parent)) == set()
    rc, output = moepack("export", "--force", path, out)
    assert rc == 0, output
    assert not _sib(out, suffix).exists() and (out / "tokenizer.json").is_file()


def test_empty_outdir_is_used(site) -> None:
    path, out = site
    out.mkdir()
    rc, output = moepack("export", path, out)
    assert rc == 0, output
    assert (out / "config.json").is_file()


def test_blob_named_like_an_export_file_is_refused(site) -> None:
    """A plain name, but export's own: it must not overwrite config.json."""
    path, out = site
    path.write_bytes(rename_blob(path.read_bytes(), "generation_config.json", "config.json"))
    _refused_both_ways(path, out, "has the name of a file export writes itself")


# --- in depth: a name that got past the reader still never leaves OUTDIR ----------------------

def test_reader_bypass_blob_name_is_refused_before_writing(site, monkeypatch) -> None:
    path, out = site
    real = Container.blob_names
    monkeypatch.setattr(Container, "blob_names", lambda c: [*real(c), "../evil"])
    before = snapshot(out.parent)
    rc, output = cli("export", path, out)
    assert_one_line_error(rc, output, 1, "only a plain file name is allowed")
    assert changes(before, snapshot(out.parent)) == set()


def test_write_new_never_leaves_the_folder_or_follows_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (folder / "link").symlink_to(victim)
    for name in ("../victim", str(victim), ".", ""):
        with pytest.raises(UnsafePathError):
            export_mod._write_new(folder, name, b"evil")
    with pytest.raises(FileExistsError):
        export_mod._write_new(folder, "link", b"evil")
    assert victim.read_bytes() == b"keep"


def test_failed_export_leaves_nothing(site, monkeypatch) -> None:
    """An error halfway (here: a damaged blob) removes this run's OUTDIR.partial, nothing else."""
    path, out = site
    (out.parent / "neighbour").write_bytes(b"n")

    def broken(c: Container, name: str) -> bytes:
        raise FormatError(f"blob {name!r}: damaged")

    monkeypatch.setattr(Container, "blob", broken)
    before = snapshot(out.parent)
    with pytest.raises(FormatError, match="damaged"):
        export(path, out)
    assert changes(before, snapshot(out.parent)) == set()


def test_full_disk_names_the_file_and_keeps_the_earlier_export(site) -> None:
    """RLIMIT_FSIZE stands in for a disk that fills while writing (EFBIG; Python ignores
    SIGXFSZ): one line naming the file that could not be written, this run's OUTDIR.partial
    removed, the export already at OUTDIR untouched."""
    import resource
    import subprocess
    import sys

    path, out = site
    assert moepack("export", path, out)[0] == 0
    before = snapshot(out.parent)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    r = subprocess.run([sys.executable, "-m", "moepack", "export", "--force", str(path),
                        str(out)], preexec_fn=small_files, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: [Errno 27] File too large: '{_sib(out, '.partial') / 'model.safetensors'}'"]
    assert changes(before, snapshot(out.parent)) == set()


def test_short_space_is_refused_before_writing(site, monkeypatch) -> None:
    """Too little room for the export: refused up front (not ENOSPC after hours of writing),
    one line with both numbers; the earlier export at OUTDIR frees nothing (it stays until the
    new one is complete), so it counts for nothing and is kept."""
    path, out = site
    assert moepack("export", path, out)[0] == 0
    before = snapshot(out.parent)
    free = type("Usage", (), {"free": 20_000})()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: free)
    rc, output = cli("export", "--force", path, out)
    assert_one_line_error(rc, output, 1, f"not enough free space for {out}: need ")
    assert "20,000 free on" in output and "nothing was written" in output
    assert changes(before, snapshot(out.parent)) == set()


def test_failed_final_rename_puts_the_earlier_export_back(site, monkeypatch) -> None:
    """The new export is complete but cannot take OUTDIR's name (ENOSPC for the directory
    entry, say): the earlier export, parked at OUTDIR.old, is renamed back, not left where a
    --force rerun removes it; this run's OUTDIR.partial goes."""
    import errno
    import os

    path, out = site
    assert moepack("export", path, out)[0] == 0
    before = snapshot(out.parent)
    real = os.rename

    def rename(src, dst) -> None:
        if Path(src) == _sib(out, ".partial"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))
        real(src, dst)

    monkeypatch.setattr(export_mod.os, "rename", rename)
    rc, output = cli("export", "--force", path, out)
    assert_one_line_error(rc, output, 1, "No space left on device")
    assert changes(before, snapshot(out.parent)) == set()


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("num_hidden_layers", 3, "which the container does not have"),
    ("hidden_size", 8, "the manifest's model needs [32, 8]"),
    ("architectures", ["EvilForCausalLM"], "manifest source.config: "),
])
def test_manifest_that_disagrees_with_the_tensors_is_refused(site, key: str, value: object,
                                                            needle: str) -> None:
    """A resealed container whose manifest describes another model: one line before any file
    is written (not a traceback halfway through)."""
    path, out = site
    doc = gen.index_doc(path.read_bytes())
    doc["manifest"]["source"]["config"][key] = value
    path.write_bytes(gen.reseal(path.read_bytes(), doc))
    _refused_both_ways(path, out, needle)
