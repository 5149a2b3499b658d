"""`moepack torrent create`: reproducible hybrid v1+v2 torrents of one container."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import libtorrent as lt
from moepack.fetch.container import read_container_id
from moepack.fetch.errors import FetchError

from moepack.safefs import UnsafePathError, write_file

MIN_PIECE = 16 << 10        # BitTorrent v2 minimum
TARGET_PIECES = 1 << 11     # ~2,000 pieces: little metadata, fine-grained enough to repair
USUAL_MAX_PIECE = 16 << 20  # what clients handle well; reached at 32 GiB
MAX_PIECES = 1 << 16        # above 1 TiB pieces grow instead of the count ...
MAX_PIECE = 64 << 20        # ... up to 64 MiB (4 TiB); beyond that the count grows
MAX_USER_PIECE = 128 << 20  # libtorrent refuses larger pieces ("invalid piece size")
CREATOR = "moepack"          # fixed: no version or date, so bytes do not vary between runs
COMMENT_PREFIX = "moepack:"
ID_KEY = b"moepack id"      # inside the info dict: covered by the info-hash, survives magnets


def auto_piece_size(file_size: int, alignment: int = 4096) -> int:
    """Power of two ≥ max(alignment, 16 KiB, min(size/2^11, 16 MiB), size/2^16), ≤ 64 MiB.

    1 GB -> 512 KiB (1,907 pieces), 100 GB -> 16 MiB (5,961), 1 TB -> 16 MiB (59,605),
    4 TiB -> 64 MiB (65,536). FORMAT.md caps alignment at 16 MiB, so the cap never undercuts it.
    """
    floor = max(alignment, MIN_PIECE, min(-(-file_size // TARGET_PIECES), USUAL_MAX_PIECE),
                -(-file_size // MAX_PIECES))
    return min(1 << (floor - 1).bit_length(), MAX_PIECE)


def check_piece_size(piece: int) -> None:
    if not MIN_PIECE <= piece <= MAX_USER_PIECE or piece & (piece - 1):
        raise FetchError(f"--piece-size {piece}: must be a power of two from 16 KiB to 128 MiB")


def source_file(path: str | Path) -> Path:
    """The container a torrent is made of, as an absolute path; FetchError unless it is a
    regular file (a FIFO or device is refused, never read)."""
    path = Path(path).absolute()
    if not os.path.exists(path):
        raise FetchError(f"{path}: no such file")
    if not path.is_file():
        raise FetchError(f"{path}: not a regular file")
    return path


def create_torrent(
    path: Path,
    *,
    piece_size: int | None = None,
    trackers: Sequence[str] = (),
    web_seeds: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
) -> bytes:
    """Bencoded torrent of one container. Same file and options → same bytes, same info-hash."""
    path = source_file(path)
    cid, alignment = read_container_id(path)
    size = path.stat().st_size
    piece = piece_size if piece_size is not None else auto_piece_size(size, alignment)
    check_piece_size(piece)
    ct = lt.create_torrent(lt.list_files(str(path)), piece)
    for tier, url in enumerate(trackers):
        ct.add_tracker(url, tier)
    for url in web_seeds:
        ct.add_url_seed(url)
    ct.set_creator(CREATOR)
    ct.set_comment(COMMENT_PREFIX + cid)
    num = ct.num_pieces()
    done = [0]

    def tick(_piece: int) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], num)

    try:
        # libtorrent wants the directory that holds what list_files() was given.
        lt.set_piece_hashes(ct, str(path.parent), tick)
    except RuntimeError as e:
        raise FetchError(f"{path}: hashing for the torrent failed: {e}") from e
    entry = ct.generate()
    entry.pop(b"creation date", None)
    entry[b"info"][ID_KEY] = cid.encode()
    return lt.bencode(entry)


def check_output(out: Path, source: Path | None = None) -> None:
    """FetchError unless `out` can be written: its folder exists, it is not a folder, and it is
    not the container itself (by resolved path, or same inode: a hard link). Checked before
    hashing, which takes minutes on a large container."""
    parent = out.absolute().parent
    if not parent.is_dir():
        raise FetchError(f"{out}: folder {parent} does not exist")
    if out.is_dir():
        raise FetchError(f"{out} is a folder; name the .torrent file to write")
    if source is not None and _same_file(out, source):
        raise FetchError(f"{out} is the container {source} itself; writing the torrent there "
                         "would replace it (name another -o FILE.torrent)")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:   # `a` does not exist yet
        return False


def write_torrent(data: bytes, out: Path, source: Path | None = None) -> None:
    """Atomic: a half-written .torrent never replaces a good one. The .tmp is a new inode (a
    planted link there is removed, not followed); the rename replaces the entry at `out`."""
    check_output(out, source)
    tmp = out.with_name(out.name + ".tmp")
    try:
        write_file(tmp, data)
        os.replace(tmp, out)
    except (OSError, UnsafePathError) as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise FetchError(f"cannot write {out}: {getattr(e, 'strerror', None) or e}") from e
