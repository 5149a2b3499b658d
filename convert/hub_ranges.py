"""Checked byte ranges of hub files: HTTP range requests, and per-block digests that make a range
checkable although the hub's SHA-256 covers only the whole file.

A SHA-256 cannot check part of a file. So one pass streams each shard once (`stream_digests`, no
disk): it checks the whole file against the hub's SHA-256 and records the BLAKE3 digest of every
`block`-byte block. A reader then fetches any range rounded out to whole blocks and checks each
block against those digests (`BlockTable.check`), so every byte used was part of the file whose
SHA-256 the hub lists.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import blake3
from moepack.convert.errors import ConvertError, SourceError

DIGEST = 32
MAX_BLOCK = 1 << 20
MIN_BLOCK = 4 << 10
BLOCKS_PER_SMALL_FILE = 256
TRIES = 4               # HTTP attempts per range (network errors, short or wrong answers)


def block_size(size: int) -> int:
    """1 MiB blocks (digests: 32 bytes per MiB of source), smaller for small files so a range
    read fetches little more than it needs."""
    b = MIN_BLOCK
    while b < MAX_BLOCK and b * BLOCKS_PER_SMALL_FILE < size:
        b *= 2
    return b


@dataclass(frozen=True)
class BlockTable:
    """The digests of one verified file: `digests[32 i: 32 i + 32]` is block i's BLAKE3."""

    name: str
    size: int
    block: int
    digests: bytes

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The whole blocks covering bytes [start, end)."""
        if not 0 <= start <= end <= self.size:
            raise SourceError(f"{self.name}: bytes {start}-{end} are outside the "
                              f"{self.size:,}-byte file")
        lo = start // self.block * self.block
        return lo, min(self.size, -(-end // self.block) * self.block)

    def check(self, lo: int, data: bytes) -> bool:
        """True when `data`, read from block-aligned offset `lo`, matches the digests."""
        for off in range(0, len(data), self.block):
            i = (lo + off) // self.block
            want = self.digests[i * DIGEST:(i + 1) * DIGEST]
            if blake3.blake3(data[off:off + self.block]).digest() != want:
                return False
        return True

    def save(self, path: Path, sha256: str) -> None:
        from moepack.safefs import write_file

        write_file(path, f"{sha256} {self.size} {self.block}\n".encode() + self.digests)

    @classmethod
    def load(cls, path: Path, name: str, size: int, sha256: str) -> BlockTable | None:
        """The table saved for this exact file (hub SHA-256 and size), else None."""
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        head, _, digests = raw.partition(b"\n")
        try:
            sha, n, block = head.decode().split()
            n_i, block_i = int(n), int(block)
        except ValueError:
            return None
        if sha != sha256 or n_i != size or block_i != block_size(size) \
                or len(digests) != -(-size // block_i) * DIGEST:
            return None
        return cls(name, size, block_i, digests)


def _session_get(url: str, headers: dict[str, str]):  # noqa: ANN202 (an httpx2 stream context)
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    h = build_hf_headers(token=os.environ.get("HF_TOKEN") or None)
    h.update({"Accept-Encoding": "identity", **headers})
    return get_session().stream("GET", url, headers=h, timeout=httpx2.Timeout(30.0, read=120.0))


def fetch_range(url: str, name: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of the file at `url` (memory: end - start); a server that ignores
    Range is read up to `end` only. ConvertError names the file after TRIES failures."""
    import httpx2

    why = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(min(0.5 * 2 ** attempt, 4.0))
        body = bytearray()
        try:
            with _session_get(url, {"Range": f"bytes={start}-{end - 1}"}) as r:
                if r.status_code not in (200, 206):
                    why = f"HTTP {r.status_code}"
                    if r.status_code in (401, 403, 404):
                        break
                    continue
                skip = start if r.status_code == 200 else 0
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) >= skip + end - start:
                        break
        except httpx2.HTTPError as e:
            why = f"{type(e).__name__}: {e}"
            continue
        data = bytes(body[skip:skip + end - start])
        if len(data) == end - start:
            return data
        why = f"short answer ({len(data)} of {end - start} bytes)"
    raise ConvertError(f"{name}: cannot read bytes {start}-{end} from the hub: {why}")


def stream_digests(url: str, name: str, size: int, sha256: str, header: bytes,
                   on_bytes=None) -> BlockTable:  # noqa: ANN001
    """Stream the whole file once (no disk): its SHA-256 must be the hub's, its first bytes the
    header planning used; returns the BLAKE3 digest of every block."""
    import httpx2

    block = block_size(size)
    whole, digests, pending = hashlib.sha256(), bytearray(), bytearray()
    got = 0
    try:
        with _session_get(url, {}) as r:
            if r.status_code != 200:
                raise ConvertError(f"{name}: HTTP {r.status_code} from the hub")
            for chunk in r.iter_bytes():
                if got + len(chunk) > size:
                    raise ConvertError(f"{name}: the hub sent more than its listed "
                                       f"{size:,} bytes")
                if got < len(header) and chunk[:len(header) - got] != header[got:got + len(chunk)]:
                    raise ConvertError(f"{name}: the file's header differs from the header the "
                                       "hub served for planning; rerun to start over")
                got += len(chunk)
                whole.update(chunk)
                pending += chunk
                while len(pending) >= block:
                    digests += blake3.blake3(pending[:block]).digest()
                    del pending[:block]
                if on_bytes:
                    on_bytes(len(chunk))
    except httpx2.HTTPError as e:
        raise ConvertError(f"{name}: download failed: {type(e).__name__}: {e}; rerun the same "
                           "command to continue") from None
    if pending:
        digests += blake3.blake3(pending).digest()
    if got != size:
        raise ConvertError(f"{name}: the hub sent {got:,} of its listed {size:,} bytes; rerun "
                           "the same command to continue")
    if whole.hexdigest() != sha256:
        raise ConvertError(f"{name}: SHA-256 {whole.hexdigest()} differs from the hub's "
                           f"{sha256}; rerun the same command to continue")
    return BlockTable(name, size, block, bytes(digests))
