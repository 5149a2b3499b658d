"""The read + hash pass: chunk boundaries, threads, O_DIRECT fallback, read errors."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from damage import flip
from moepack.format import Container
from moepack.format.limits import HEADER_SIZE
from moepack.format.synthetic import mixtral_spec, write_synthetic
from moepack.verify import reads, verify
from moepack.verify.judge import judge
from moepack.verify.plan import build_items, tables_by_layer
from moepack.verify.reads import RangeReader
from moepack.verify.scan import scan

PAGE = 4096


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("reads") / "blob.bin"
    p.write_bytes(os.urandom(10 * PAGE + 123))
    return p


@pytest.mark.parametrize("mode", ["direct", "buffered"])
@pytest.mark.parametrize("depth", [0, 1, 3])
@pytest.mark.parametrize("span", [(0, 10 * PAGE + 123), (128, 5 * PAGE + 7), (PAGE + 1, PAGE + 2)])
def test_chunks_cover_exactly_the_range(blob: Path, mode: str, depth: int,
                                        span: tuple[int, int]) -> None:
    start, end = span
    data = blob.read_bytes()
    got = bytearray()
    with RangeReader(blob, start, end, mode=mode, chunk=PAGE, depth=depth) as r:  # type: ignore[arg-type]
        for ch in r.chunks():
            assert ch.error is None and ch.offset == start + len(got)
            got += ch.data
    assert bytes(got) == data[start:end]


def test_einval_falls_back_to_buffered(blob: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.preadv
    with RangeReader(blob, 0, 3 * PAGE, mode="direct", chunk=PAGE) as r:
        if not r.direct:
            pytest.skip("no O_DIRECT on this filesystem")
        direct_fd = r._direct_fd

        def preadv(fd: int, bufs: list, off: int) -> int:
            if fd == direct_fd:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, bufs, off)

        monkeypatch.setattr(reads.os, "preadv", preadv)
        got = b"".join(bytes(c.data) for c in r.chunks())
        assert not r.direct
    assert got == blob.read_bytes()[:3 * PAGE]


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("scan") / "m.moepack"
    write_synthetic(p, mixtral_spec(vocab=512))  # embed (64 KiB) spans many 4 KiB chunks
    return p


def _scan_labels(path: Path, **kw: object) -> list[str]:
    with Container.open(path) as c:
        sections, end = c.sections, c.header.index_offset
    items = build_items(sections, HEADER_SIZE, end)
    res = scan(path, items, HEADER_SIZE, end, **kw)  # type: ignore[arg-type]
    damage, _ = judge(items, res, tables_by_layer(sections))
    return [d.label for d in damage]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_small_chunks_and_threads_agree(container: Path, tmp_path: Path, threads: int) -> None:
    path = tmp_path / "m.moepack"
    shutil.copyfile(container, path)
    with Container.open(path) as c:
        embed = c.tensor_info("embed")
        rec = c.expert_range(1, 1)[0]
    flip(path, embed["offset"] + embed["length"] - 1, 1)  # last byte of a multi-chunk item
    flip(path, rec, 1)
    want = ["tensor embed", "layer 1 expert 1"]
    assert [d.label for d in verify(path).damaged] == want
    assert _scan_labels(path, threads=threads, chunk=PAGE) == want


def test_read_error_marks_overlapping_items(container: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with Container.open(container) as c:
        rec, stride = c.expert_range(0, 2)
    real = os.preadv

    def preadv(fd: int, bufs: list, off: int) -> int:
        if off <= rec < off + PAGE:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, off)

    monkeypatch.setattr(reads.os, "preadv", preadv)
    with Container.open(container) as c:
        sections, end = c.sections, c.header.index_offset
    items = build_items(sections, HEADER_SIZE, end)
    res = scan(container, items, HEADER_SIZE, end, chunk=PAGE)
    damage, _ = judge(items, res, tables_by_layer(sections))
    assert [d.label for d in damage] == ["layer 0 expert 2"]
    assert "read error" in damage[0].detail
    assert damage[0].code is None  # a plain I/O failure breaks no format rule (FORMAT.md §11.1)


def test_file_shrinking_during_scan(container: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Container.open(container) as c:
        sections, end = c.sections, c.header.index_offset
        cut = c.expert_range(1, 0)[0]
    real = os.preadv
    monkeypatch.setattr(reads.os, "preadv",
                        lambda fd, bufs, off: 0 if off >= cut else real(fd, bufs, off))
    items = build_items(sections, HEADER_SIZE, end)
    res = scan(container, items, HEADER_SIZE, end, chunk=PAGE)
    damage, _ = judge(items, res, tables_by_layer(sections))
    assert [d.label for d in damage][:2] == ["layer 1 expert 0", "layer 1 expert 1"]
    assert all("ended" in d.detail for d in damage)
    assert {d.code for d in damage} == {"file_size_mismatch"}  # the file shrank since opened


def test_auto_reads_cached_files_from_the_page_cache(blob: Path) -> None:
    from moepack.verify.reads import choose_direct
    from moepack.verify.residency import cached_fraction

    from bench.disk import drop_cache

    size = blob.stat().st_size
    blob.read_bytes()
    assert cached_fraction(blob, 0, size) == 1.0
    assert not choose_direct("auto", blob, 0, size)
    fd = os.open(blob, os.O_RDONLY)
    os.fsync(fd)  # dirty pages cannot be dropped
    os.close(fd)
    drop_cache(blob)
    if (cached_fraction(blob, 0, size) or 0) > 0.5:
        pytest.skip("this filesystem keeps the file cached (tmpfs?)")
    assert choose_direct("auto", blob, 0, size)
    assert choose_direct("direct", blob, 0, size) and not choose_direct("buffered", blob, 0, size)


def test_file_shrinking_during_scan_names_one_end(container: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every item past the cut names where the file ended, not the start of the chunk that
    happened to read nothing (which made each later item name another, wrong, end)."""
    with Container.open(container) as c:
        sections, end = c.sections, c.header.index_offset
        cut = c.expert_range(1, 0)[0] + 100
    real = os.preadv

    def preadv(fd: int, bufs: list, off: int) -> int:
        if off >= cut:
            return 0
        n = real(fd, bufs, off)
        return min(n, cut - off)

    monkeypatch.setattr(reads.os, "preadv", preadv)
    items = build_items(sections, HEADER_SIZE, end)
    res = scan(container, items, HEADER_SIZE, end, chunk=PAGE)
    damage, _ = judge(items, res, tables_by_layer(sections))
    assert len(damage) > 2
    assert {d.detail for d in damage} == {f"file ended at offset {cut} during verification"}
