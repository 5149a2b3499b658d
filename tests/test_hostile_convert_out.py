"""`moepack convert` and the files it makes beside OUT: a link or FIFO planted at OUT.partial or
OUT.journal is refused with one line, never followed, truncated or removed; a link at OUT is
taken (not overwritten without --force) and with --force replaced itself, never written through.
The writer and the journal open their files without following links, for every caller."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hostile_snapshot import (
    BLOBS,
    assert_one_line_error,
    changes,
    cli,
    moepack,
    snapshot,
)
from moepack.convert.errors import ConvertError
from moepack.convert.journal import Journal
from moepack.format import ContainerWriter, plan_layout
from moepack.format.layout import BlobSpec, ContainerSpec
from tiny_models import make_checkpoint

from moepack.safefs import UnsafePathError

FAST = ("--expert-codec", "rvq3-baseline", "--iters", "3", "-q")
VICTIM = b"the user's file"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return make_checkpoint("mixtral", tmp_path_factory.mktemp("hostile-src") / "ck")


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path]:
    """(OUT, victim): the victim is a file the user can write, outside anything convert makes."""
    (tmp_path / "outdir").mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    return tmp_path / "outdir" / "m.moepack", victim


def _sib(out: Path, suffix: str) -> Path:
    return out.with_name(out.name + suffix)


@pytest.mark.parametrize("suffix", [".partial", ".journal"])
@pytest.mark.parametrize("flags", [(), ("--restart",), ("--force", "--restart")])
def test_link_beside_out_is_refused(source: Path, site, suffix: str, flags: tuple) -> None:
    out, victim = site
    _sib(out, suffix).symlink_to(victim)
    before = snapshot(out.parent.parent)
    rc, output = cli("convert", *FAST, *flags, source, out)
    assert_one_line_error(rc, output, 1, "is a symbolic link")
    assert changes(before, snapshot(out.parent.parent)) == set()
    assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("suffix", [".partial", ".journal"])
def test_fifo_beside_out_is_refused_without_blocking(source: Path, site, suffix: str) -> None:
    out, _ = site
    os.mkfifo(_sib(out, suffix))
    before = snapshot(out.parent.parent)
    rc, output = moepack("convert", *FAST, source, out, timeout=60)
    assert_one_line_error(rc, output, 1, "is not a regular file")
    assert changes(before, snapshot(out.parent.parent)) == set()


def test_dangling_link_at_out_counts_as_existing(source: Path, site) -> None:
    out, victim = site
    missing = victim.with_name("not-there")
    out.symlink_to(missing)
    before = snapshot(out.parent.parent)
    rc, output = cli("convert", *FAST, source, out)
    assert_one_line_error(rc, output, 1, "already exists; pass --force")
    assert changes(before, snapshot(out.parent.parent)) == set()


def test_force_replaces_a_link_at_out_not_its_target(source: Path, site) -> None:
    out, victim = site
    out.symlink_to(victim)
    rc, output = cli("convert", *FAST, "--force", source, out)
    assert rc == 0, output
    assert not out.is_symlink() and out.stat().st_size > 1000
    assert victim.read_bytes() == VICTIM
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.moepack"]


# --- the writer and the journal themselves ---------------------------------------------------

def _layout():
    from moepack.format import Container

    with Container.open(BLOBS) as c:
        manifest = c.manifest
    return plan_layout(ContainerSpec(manifest, (), (), (BlobSpec("x.json", 4),), alignment=512))


def test_writer_never_writes_through_a_link_at_the_partial(site) -> None:
    out, victim = site
    partial = _sib(out, ".partial")
    partial.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        ContainerWriter(out, _layout(), create=False)  # attach: resume and worker processes
    with ContainerWriter(out, _layout(), create=True) as w:  # new: a fresh inode replaces the link
        w.write_blob("x.json", b"abcd")
        w.finalize()
    assert victim.read_bytes() == VICTIM and not partial.exists() and out.is_file()


def test_writer_finalize_replaces_a_link_at_out_only_with_overwrite(site) -> None:
    out, victim = site
    w = ContainerWriter(out, _layout(), create=True)
    w.write_blob("x.json", b"abcd")
    out.symlink_to(victim)  # planted while converting
    with pytest.raises(FileExistsError):
        w.finalize()
    assert victim.read_bytes() == VICTIM and out.is_symlink()
    w = ContainerWriter(out, _layout(), create=False, overwrite=True)
    w.finalize()
    assert victim.read_bytes() == VICTIM and not out.is_symlink()


def test_journal_never_follows_a_link(site) -> None:
    out, victim = site
    jpath = _sib(out, ".journal")
    jpath.symlink_to(victim)
    assert Journal.read_header(jpath) is None
    with pytest.raises(UnsafePathError, match="symbolic link"):
        Journal.create(jpath, {"x": 1})
    with pytest.raises(UnsafePathError, match="symbolic link"):
        Journal.resume(jpath)
    assert victim.read_bytes() == VICTIM


def test_journal_header_of_a_fifo_does_not_block(site) -> None:
    out, _ = site
    jpath = _sib(out, ".journal")
    os.mkfifo(jpath)
    got: list = []
    t = threading.Thread(target=lambda: got.append(Journal.read_header(jpath)), daemon=True)
    t.start()
    t.join(10)
    assert got == [None]
    with pytest.raises(UnsafePathError, match="not a regular file"):
        Journal.create(jpath, {"x": 1})


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"\n", b"[1, 2]\n", b'"text"\n'],
                         ids=["deep", "list", "string"])
def test_journal_that_is_not_one_is_refused_in_one_error(site, body: bytes) -> None:
    """A planted OUT.journal is untrusted JSON (moepack/untrusted_json.py): not a journal, and
    no RecursionError or AttributeError."""
    out, _ = site
    jpath = _sib(out, ".journal")
    jpath.write_bytes(body)
    assert Journal.read_header(jpath) is None
    with pytest.raises(ConvertError, match="not a moepack conversion journal"):
        Journal.resume(jpath)


def test_journal_with_foreign_records_keeps_the_good_part(site) -> None:
    out, _ = site
    jpath = _sib(out, ".journal")
    j = Journal.create(jpath, {"x": 1})
    j.close()
    with open(jpath, "ab") as f:
        f.write(b'{"u": "a", "h": "1"}\n' + b"[" * 100_000 + b'\n{"u": "b", "h": "2"}\n')
    j = Journal.resume(jpath)
    try:
        assert j.done == {"a": "1"}       # the record after the foreign line is dropped
    finally:
        j.close()
