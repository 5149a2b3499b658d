"""Torrent fetches on 127.0.0.1 that other clients' torrents and bad sources bring about:
v2-only torrents (a pad file next to the container), a source that only sends errors or
damaged data, staging left by another torrent of the same container."""

from __future__ import annotations

from pathlib import Path

import libtorrent as lt
import pytest
from moepack.fetch.errors import FetchError
from moepack.fetch.lt_session import listen_port, make_session
from moepack.fetch.staging import STAGING_DIR
from moepack.fetch.torrent import (
    FetchOptions,
    TorrentPlan,
    create_torrent,
    fetch_torrent,
    seed_in_background,
    write_torrent,
)
from moepack.fetch.torrent_create import ID_KEY
from moepack.format.synthetic import mixtral_spec, write_synthetic
from range_server import Body, Fault, RangeServer
from torrent_loopback import LOCAL, fetched, loopback_opts, small_torrent

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    return small_torrent(tmp_path_factory.mktemp("small"))


def _v2_only(path: Path, cid: str, out: Path) -> Path:
    """What a v2-only client makes of one file: libtorrent pads it to a whole piece."""
    ct = lt.create_torrent(lt.list_files(str(path)), 16384, lt.create_torrent.v2_only)
    lt.set_piece_hashes(ct, str(path.parent))
    entry = ct.generate()
    entry[b"info"][ID_KEY] = cid.encode()
    out.write_bytes(lt.bencode(entry))
    assert lt.torrent_info(str(out)).num_files() == 2, "the pad file this test is about"
    return out


def test_a_v2_only_torrent_with_its_pad_file_is_fetched(small, tmp_path: Path) -> None:
    path, _, cid = small
    torrent = _v2_only(path, cid, tmp_path / "v2.torrent")
    plan = fetch_torrent(str(torrent), tmp_path / "dl", dry_run=True, opts=loopback_opts())
    assert isinstance(plan, TorrentPlan) and plan.meta.size == path.stat().st_size
    seen: list[tuple[int, int]] = []
    with seed_in_background(torrent, path) as seeder:
        opts = FetchOptions(loopback_opts(seeder.port).peers, LOCAL, stall_timeout=20,
                            progress=lambda p: seen.append((p.done, p.total)))
        r = fetched(fetch_torrent(str(torrent), tmp_path / "dl", opts=opts))
    assert r.container_id == cid and r.path.read_bytes() == path.read_bytes()
    assert seen[-1] == (path.stat().st_size,) * 2, "the bar ends at the container's size"
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == [path.name], "no pad on disk"


@pytest.mark.parametrize("status", [404, 500])
def test_a_failing_web_seed_is_named_with_its_status(small, tmp_path: Path, status: int) -> None:
    path, _, _ = small
    with RangeServer({}) as web:   # nothing there: 404
        if status != 404:
            web.faults["/" + path.name] = Fault("answer", times=-1, answer=Body(
                b"broken", status, {}, "text/plain"))
        torrent = tmp_path / "web.torrent"
        torrent.write_bytes(create_torrent(path, web_seeds=[web.url(path.name)]))
        with pytest.raises(FetchError, match="no data for 3 s") as err:
            fetch_torrent(str(torrent), tmp_path / "dl", opts=loopback_opts(stall=3.0))
    assert f"web seed '{web.url(path.name)}' failed: {status}" in str(err.value), err.value
    assert not (tmp_path / "dl" / path.name).exists()


def test_a_seeder_with_damaged_data_is_named(small, tmp_path: Path) -> None:
    """A client that claims every piece (resume data) of a damaged copy, which libtorrent's own
    seed_mode would catch: the fetch's error says pieces failed their hash check, and from whom."""
    path, torrent, _ = small
    bad = tmp_path / "bad" / path.name
    bad.parent.mkdir()
    data = bytearray(path.read_bytes())
    for off in range(100, len(data), 16384):   # every piece
        data[off] ^= 0xFF
    bad.write_bytes(bytes(data))
    liar = make_session(LOCAL)
    params = lt.load_torrent_buffer(torrent.read_bytes())
    params.save_path = str(bad.parent)
    params.have_pieces = [True] * lt.torrent_info(str(torrent)).num_pieces()
    params.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
    liar.add_torrent(params)
    port = listen_port(liar)
    with pytest.raises(FetchError, match="no data for 3 s") as err:
        fetch_torrent(str(torrent), tmp_path / "dl", opts=loopback_opts(port, stall=3.0))
    assert "failed their hash check" in str(err.value) and "127.0.0.1:" in str(err.value)
    assert not (tmp_path / "dl" / path.name).exists()


def _key(torrent: Path) -> str:
    return str(lt.torrent_info(str(torrent)).info_hashes().get_best())


def test_staging_left_by_another_torrent_of_the_container_is_reused(small, tmp_path: Path) -> None:
    """An interrupted fetch of torrent A (16 KiB pieces), then torrent B of the same container
    (32 KiB pieces): B starts from A's staged bytes and removes A's staging when done."""
    path, torrent_a, _ = small
    torrent_b = tmp_path / "b.torrent"
    write_torrent(create_torrent(path, piece_size=32 << 10), torrent_b)
    assert _key(torrent_b) != _key(torrent_a)
    data = path.read_bytes()
    half = len(data) // 2
    dest = tmp_path / "dest"
    left = dest / STAGING_DIR / _key(torrent_a) / path.name
    left.parent.mkdir(parents=True)
    left.write_bytes(data[:half])   # the header first, as fetch asks for it
    (left.parent / "resume.dat").write_bytes(b"de")
    plan = fetch_torrent(str(torrent_b), dest, dry_run=True, opts=loopback_opts())
    assert isinstance(plan, TorrentPlan) and plan.present >= half
    with seed_in_background(torrent_b, path) as seeder:
        r = fetched(fetch_torrent(str(torrent_b), dest, opts=loopback_opts(seeder.port)))
    assert r.path.read_bytes() == data
    assert r.pieces_at_start >= half // (32 << 10)
    assert r.downloaded_bytes <= len(data) - half + (32 << 10)
    assert not (dest / STAGING_DIR).exists(), "A's staging went with B's"


def test_superseded_staging_is_removed_and_nothing_else(small, tmp_path: Path) -> None:
    """After publishing, staging of another container under the same file name goes (that name
    now holds a verified container); other staging stays, and a link is never followed."""
    path, torrent, _ = small
    other = tmp_path / "other" / path.name
    other.parent.mkdir()
    write_synthetic(other, mixtral_spec(layers=1, experts=2))
    root = tmp_path / "dest" / STAGING_DIR
    same_name = root / ("1" * 40) / path.name
    unrelated = root / ("2" * 40) / "other.moepack"
    for f in (same_name, unrelated):
        f.parent.mkdir(parents=True)
        f.write_bytes(other.read_bytes())
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / path.name).write_bytes(b"precious")
    (root / ("3" * 40)).symlink_to(victim)
    with seed_in_background(torrent, path) as seeder:
        r = fetched(fetch_torrent(str(torrent), tmp_path / "dest", opts=loopback_opts(seeder.port)))
    assert r.pieces_at_start == 0, "another container's bytes are not taken"
    assert not same_name.parent.exists()
    assert unrelated.read_bytes() == other.read_bytes()
    assert (root / ("3" * 40)).is_symlink() and (victim / path.name).read_bytes() == b"precious"


class _Stop(Exception):
    pass


def test_an_interrupted_fetch_has_the_header_first(tmp_path: Path) -> None:
    """So that its staged copy says which container it is (what reuse by another torrent of
    the container goes by): a few hundred pieces, stopped after 16 of them."""
    from moepack.fetch.container import header_claim

    path = tmp_path / "src" / "mid.moepack"
    path.parent.mkdir()
    cid = write_synthetic(path, mixtral_spec(layers=2, experts=16, hidden=256, inter=96))
    torrent = path.with_suffix(".torrent")
    write_torrent(create_torrent(path, piece_size=16 << 10), torrent)
    piece = 16 << 10
    assert path.stat().st_size > 100 * piece

    def stop(p) -> None:  # noqa: ANN001
        if p.done >= 16 * piece:
            raise _Stop

    with seed_in_background(torrent, path, upload_limit=16 * piece) as seeder:
        opts = FetchOptions(loopback_opts(seeder.port).peers, LOCAL, stall_timeout=20,
                            progress=stop)
        with pytest.raises(_Stop):
            fetch_torrent(str(torrent), tmp_path / "dl", opts=opts)
    (staged,) = (tmp_path / "dl" / STAGING_DIR).glob(f"*/{path.name}")
    assert header_claim(staged) == cid
