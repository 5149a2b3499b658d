"""Turn `magnet:?…`, `FILE.torrent` or `https://…/FILE.torrent` into checked torrent metadata.

Everything here is untrusted input: each failure is a FetchError naming the source.
"""

from __future__ import annotations

import os
import re
import stat
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt
from moepack.fetch.errors import FetchError
from moepack.fetch.torrent_create import COMMENT_PREFIX, ID_KEY

from moepack.safefs import name_problem, printable, read_bounded

MAX_TORRENT_BYTES = 64 << 20   # a 4 TiB container with 64 MiB pieces needs ~3.5 MB
URL_TIMEOUT_S = 60.0
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@\S+)?")
CONTAINER_MAGIC = b"MOEPACK\x00"   # FORMAT.md §2


@dataclass(frozen=True)
class TorrentMeta:
    """A single-file torrent of (what claims to be) a moepack container."""

    ti: lt.torrent_info
    name: str
    size: int
    container_id: str | None      # None: the torrent does not say (made by another tool)
    info_hash: str                # 40 hex: libtorrent's "best" (v2 truncated when present, else v1)
    source: str
    file_index: int = 0           # the container's index among the files (pad files around it)

    @property
    def piece_length(self) -> int:
        return self.ti.piece_length()

    @property
    def num_pieces(self) -> int:
        return self.ti.num_pieces()


def is_magnet(source: str) -> bool:
    return source.startswith("magnet:")


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def is_torrent_source(source: str) -> bool:
    return is_magnet(source) or is_url(source) or source.endswith(".torrent")


def load_params(source: str) -> lt.add_torrent_params:
    """add_torrent_params for a magnet (no metadata yet) or a torrent (metadata in `.ti`)."""
    if is_magnet(source):
        try:
            return lt.parse_magnet_uri(source)
        except (RuntimeError, ValueError) as e:
            raise FetchError(f"malformed magnet link {printable(source, 80)}: {e}") from e
    data = _download(source) if is_url(source) else _read(Path(source))
    if data.startswith(CONTAINER_MAGIC):
        _not_a_torrent(source)
    return parse_torrent(data, source)


def _not_a_torrent(source: str | Path) -> None:
    raise FetchError(f"{source} is a moepack container, not a torrent; to share it, make one "
                     f"with `moepack torrent create {source}` and seed that")


def parse_torrent(data: bytes, source: str) -> lt.add_torrent_params:
    """Torrent bytes (untrusted) -> add_torrent_params with metadata; FetchError otherwise."""
    try:
        params = lt.load_torrent_buffer(data)
    except (RuntimeError, ValueError) as e:   # bdecode and metadata errors; bad UTF-8
        raise FetchError(f"malformed torrent {source}: {e}") from e
    if params.ti is None:
        raise FetchError(f"malformed torrent {source}: no metadata")
    return params


def _payload_file(ti: lt.torrent_info, source: str) -> int:
    """The index of the one file that is not padding. libtorrent flags pad files (a v2 torrent
    pads its single file to a whole piece); they are never requested nor written."""
    layout = ti.layout()
    real = [i for i in range(layout.num_files())
            if not layout.file_flags(i) & layout.flag_pad_file]
    if len(real) != 1:
        raise FetchError(f"torrent {source}: holds {len(real)} files; "
                         "a moepack torrent holds one")
    return real[0]


def describe(ti: lt.torrent_info, source: str) -> TorrentMeta:
    """Check the shape moepack needs (one plain file) and read the container ID it claims."""
    index = _payload_file(ti, source)
    try:
        name = ti.layout().file_path(index)
    except (RuntimeError, ValueError) as e:   # a name that is not UTF-8
        raise FetchError(f"torrent {source}: unreadable file name ({e})") from e
    problem = name_problem(name) or ("starts with '.'" if name.startswith(".") else None)
    if problem:
        raise FetchError(f"torrent {source}: unusable file name {printable(name)}: {problem}")
    best = str(ti.info_hashes().get_best())
    return TorrentMeta(ti, name, ti.layout().file_size(index), _claimed_id(ti, source), best,
                       source, index)


def _claimed_id(ti: lt.torrent_info, source: str) -> str | None:
    """The ID from the info dict (covered by the info-hash), else from the comment."""
    claimed: str | None = None
    try:
        info = lt.bdecode(ti.info_section())
        raw = info.get(ID_KEY) if isinstance(info, dict) else None
        if isinstance(raw, bytes):
            claimed = raw.decode("ascii", "replace")
    except RuntimeError:
        pass
    try:
        comment = ti.comment() or ""
    except (RuntimeError, ValueError):   # a comment that is not UTF-8 states no ID
        comment = ""
    if claimed is None and comment.startswith(COMMENT_PREFIX):
        claimed = comment[len(COMMENT_PREFIX):].strip()
    if claimed is not None and not _HEX64.fullmatch(claimed):
        raise FetchError(f"torrent {source}: malformed container ID {printable(claimed, 80)}")
    return claimed


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FetchError(f"{path}: not a regular file")
            if os.pread(fd, len(CONTAINER_MAGIC), 0) == CONTAINER_MAGIC:   # before the size
                _not_a_torrent(path)
            if st.st_size > MAX_TORRENT_BYTES:
                raise FetchError(f"{path}: {st.st_size} bytes is too large for a .torrent")
            data = read_bounded(f, MAX_TORRENT_BYTES)
    except FileNotFoundError as e:
        hint = (f"; for a hub repository write hf:{path}" if _HUB_REPO.fullmatch(str(path))
                else "")
        raise FetchError(f"cannot read torrent {path}: {e.strerror or e}{hint}") from e
    except OSError as e:
        raise FetchError(f"cannot read torrent {path}: {e.strerror or e}") from e
    if len(data) > MAX_TORRENT_BYTES:  # grew since the fstat
        raise FetchError(f"{path}: more than {MAX_TORRENT_BYTES} bytes is too large for a .torrent")
    return data


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as r:
            data = read_bounded(r, MAX_TORRENT_BYTES)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"cannot download torrent {url}: {e}") from e
    if len(data) > MAX_TORRENT_BYTES:
        raise FetchError(f"{url}: more than {MAX_TORRENT_BYTES} bytes; not a .torrent")
    return data
