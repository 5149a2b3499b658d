"""Seeding a container: `moepack seed` and `seed_in_background` for the demo and tests."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import libtorrent as lt
from moepack.fetch.container import check_container, peek_container_id
from moepack.fetch.errors import FetchError
from moepack.fetch.lt_session import listen_port, make_session
from moepack.fetch.torrent_source import TorrentMeta, describe, load_params


@dataclass(frozen=True)
class SeedStatus:
    peers: int
    upload_rate: float      # bytes/s, payload
    uploaded: int           # payload bytes since start
    pieces: int
    num_pieces: int
    error: str | None


def check_seedable(meta: TorrentMeta, data_path: Path, *, full: bool) -> None:
    """The file is the container the torrent describes, by moepack's own hashes.

    quick (default): header, index and section hashes, then libtorrent seed_mode checks each
    piece against the torrent the first time a peer asks for it, so a 1 TB container starts
    seeding at once instead of after a ~20 min rehash. full: every byte by BLAKE3 first.
    """
    if not data_path.is_file():
        raise FetchError(f"{data_path}: no such file")
    size = data_path.stat().st_size
    if size != meta.size:
        raise FetchError(f"{data_path}: {size} bytes, torrent {meta.source} describes {meta.size}")
    checked = check_container(data_path, quick=not full)
    if not checked.ok:
        raise FetchError(f"{data_path}: does not verify ({checked.problem}); repair it with "
                         f"`moepack fetch {meta.source} --dest {data_path.parent}`")
    if meta.container_id is not None and checked.container_id != meta.container_id:
        raise FetchError(f"{data_path}: container {checked.container_id}, torrent "
                         f"{meta.source} is for {meta.container_id}")


class Seeder:
    """A libtorrent session seeding one container. Context manager; `port` is where it listens."""

    def __init__(self, torrent_path: Path | str, data_path: Path | str, *,
                 listen: str = "127.0.0.1:0", upload_limit: int = 0, full_verify: bool = False,
                 discovery: bool | None = None) -> None:
        data_path = Path(data_path).absolute()
        params = load_params(str(torrent_path))
        meta = describe(params.ti, str(torrent_path))
        check_seedable(meta, data_path, full=full_verify)
        self.meta = meta
        self.data_path = data_path
        self._seen = _identity(data_path)  # the file checked above, by device and inode
        self.session = make_session(listen, discovery=discovery, exact_port=True)
        if data_path.name != meta.name:
            params.renamed_files = {meta.file_index: data_path.name}
        params.save_path = str(data_path.parent)
        params.flags |= lt.torrent_flags.seed_mode
        params.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        self.handle = self.session.add_torrent(params)
        self.set_upload_limit(upload_limit)
        self.port = listen_port(self.session)

    def set_upload_limit(self, bytes_per_s: int) -> None:
        """0 = unlimited. Torrent-level limits also apply to loopback peers (session ones don't)."""
        self.handle.set_upload_limit(bytes_per_s if bytes_per_s > 0 else -1)

    def status(self) -> SeedStatus:
        st = self.handle.status()
        err = str(st.errc.message()) if st.errc.value() else self._replaced()
        return SeedStatus(st.num_peers, float(st.upload_payload_rate), st.total_payload_upload,
                          st.num_pieces, self.meta.num_pieces, err)

    def _replaced(self) -> str | None:
        """Why the file at the seeded path is no longer the container checked at start (a
        `convert --force` or a fetch renamed another file onto it), or None. libtorrent opens
        files by path, so it would serve the new file's bytes under this torrent's hashes."""
        now = _identity(self.data_path)
        if now == self._seen:
            return None
        if now is not None and peek_container_id(self.data_path) == self.meta.container_id:
            self._seen = now  # the same container written again: same bytes, go on
            return None
        what = "removed" if now is None else "replaced by another file"
        return (f"{self.data_path} was {what} while seeding, so it is no longer the container "
                f"this torrent describes ({self.meta.container_id}); stopped. Seed the new file "
                "with its own torrent (moepack torrent create)")

    def close(self) -> None:
        if self.handle.is_valid():
            self.session.remove_torrent(self.handle)
        self.session.pause()

    def __enter__(self) -> Seeder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def seed_in_background(torrent_path: Path | str, data_path: Path | str, *,
                       listen: str = "127.0.0.1:0", upload_limit: int = 0) -> Seeder:
    """Start seeding on libtorrent's own threads; use as `with seed_in_background(...) as s:`."""
    return Seeder(torrent_path, data_path, listen=listen, upload_limit=upload_limit)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
