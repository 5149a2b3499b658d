"""`moepack torrent create`: reproducible hybrid torrents, piece-size rule, container ID."""

from __future__ import annotations

from pathlib import Path

import libtorrent as lt
import pytest
from moepack.fetch.errors import FetchError
from moepack.fetch.torrent import auto_piece_size, create_torrent
from moepack.fetch.torrent_create import ID_KEY
from moepack.fetch.torrent_source import describe
from moepack.format.synthetic import mixtral_spec, write_synthetic
from typer.testing import CliRunner

from moepack.cli import app

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("c") / "tiny.moepack"
    cid = write_synthetic(path, mixtral_spec(layers=2, experts=8, hidden=128, inter=64))
    return path, cid


def test_same_file_same_bytes_and_info_hash(container: tuple[Path, str], tmp_path: Path) -> None:
    path, cid = container
    a, b = create_torrent(path), create_torrent(path)
    assert a == b
    # A copy elsewhere (other mtime, other directory) gives the same torrent too.
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    assert create_torrent(copy) == a
    ti = lt.torrent_info(a)
    ih = ti.info_hashes()
    assert ih.has_v1() and ih.has_v2(), "hybrid v1+v2"
    assert ti.comment() == f"moepack:{cid}"
    assert ti.creation_date() == 0 and ti.creator() == "moepack"
    assert lt.bdecode(ti.info_section())[ID_KEY] == cid.encode()
    assert describe(ti, "t").container_id == cid
    assert ti.piece_length() == 16 * KiB and ti.total_size() == path.stat().st_size


def test_options_change_only_what_they_name(container: tuple[Path, str]) -> None:
    path, _ = container
    base = lt.torrent_info(create_torrent(path))
    seeded = lt.torrent_info(create_torrent(path, web_seeds=["http://127.0.0.1:1/x"],
                                            trackers=["http://127.0.0.1:2/announce"]))
    assert str(seeded.info_hashes().v1) == str(base.info_hashes().v1), "outside the info dict"
    assert list(lt.load_torrent_buffer(create_torrent(path, web_seeds=["http://127.0.0.1:1/x"]))
                .url_seeds) == ["http://127.0.0.1:1/x"]
    bigger = lt.torrent_info(create_torrent(path, piece_size=64 * KiB))
    assert bigger.piece_length() == 64 * KiB
    assert str(bigger.info_hashes().v1) != str(base.info_hashes().v1)


@pytest.mark.parametrize(("size", "alignment", "piece"), [
    (500 * KiB, 4096, 16 * KiB),
    (100 * MiB, 4096, 64 * KiB),
    (10**9, 4096, 512 * KiB),                # libtorrent's own default picks the same
    (100 * 10**9, 4096, 16 * MiB),
    (982 * 10**9, 4096, 16 * MiB),           # the peer's 982 GB torrent: 58.5k pieces, not 4 M
    (1 * TiB, 4096, 16 * MiB),
    (2 * TiB, 4096, 32 * MiB),
    (4 * TiB, 4096, 64 * MiB),
    (16 * TiB, 4096, 64 * MiB),              # capped: 262k pieces
    (10 * MiB, 2 * MiB, 2 * MiB),            # never below the container alignment
])
def test_auto_piece_size_rule(size: int, alignment: int, piece: int) -> None:
    got = auto_piece_size(size, alignment)
    assert got == piece
    assert got & (got - 1) == 0 and got >= max(alignment, 16 * KiB)
    assert -(-size // got) <= 1 << 16 or got == 64 * MiB
    assert got <= 16 * MiB or -(-size // (got // 2)) > 1 << 16


def test_bad_inputs_are_refused(container: tuple[Path, str], tmp_path: Path) -> None:
    junk = tmp_path / "junk.moepack"
    junk.write_bytes(b"\x01" * 5000)
    with pytest.raises(FetchError, match=r"junk.moepack: .*\[bad_magic\]"):
        create_torrent(junk)
    with pytest.raises(FetchError, match="power of two"):
        create_torrent(container[0], piece_size=3 * 16 * KiB)
    with pytest.raises(FetchError, match="not a regular file"):
        create_torrent(tmp_path)
    with pytest.raises(FetchError, match="128 MiB"):
        create_torrent(container[0], piece_size=256 * MiB)


def test_cli_create(container: tuple[Path, str], tmp_path: Path) -> None:
    path, cid = container
    out = tmp_path / "t.torrent"
    r = CliRunner().invoke(app, ["torrent", "create", str(path), "-o", str(out),
                                 "--piece-size", "32KiB", "--web-seed", "http://127.0.0.1:9/f"])
    assert r.exit_code == 0, r.output
    assert cid in r.output and "magnet:?xt=urn:btih:" in r.output
    assert lt.torrent_info(out.read_bytes()).piece_length() == 32 * KiB
    bad = CliRunner().invoke(app, ["torrent", "create", str(path), "--piece-size", "lots"])
    assert bad.exit_code == 2 and "--piece-size" in bad.output and "lots" in bad.output
