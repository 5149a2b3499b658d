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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import blake3
from moepack.convert.errors import ConvertError, SourceError

DIGEST = 32
MAX_BLOCK = 1 << 20
MIN_BLOCK = 4 << 10
BLOCKS_PER_SMALL_FILE = 256
TRIES = 4               # HTTP attempts per range (network errors, short or wrong answers)
BACKOFF = 0.5           # seconds before the second attempt, doubled after each (at most 8x)


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


class HubToken:
    """The driver's hub token, passed to the tasks as an argument (a cluster node has its own
    environment, without the driver's HF_TOKEN); never shown in a repr, a log or an error."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "HubToken(hidden)"


def driver_token() -> HubToken | None:
    """The token this process sends to the hub (HF_TOKEN, else huggingface_hub's saved one)."""
    from huggingface_hub import get_token

    value = os.environ.get("HF_TOKEN") or get_token()
    return HubToken(value) if value else None


def refused(status: int) -> str:
    """Why the hub answered `status` to a file request, for a one-line error."""
    if status in (401, 403):
        return (f"HTTP {status}: the hub refused access (a private or gated repository needs "
                "HF_TOKEN set where convert runs)")
    return f"HTTP {status}"


def _session_get(url: str, headers: dict[str, str],  # noqa: ANN202 (an httpx2 stream context)
                 token: HubToken | None = None):
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    h = build_hf_headers(token=token.value if token else os.environ.get("HF_TOKEN") or None)
    h.update({"Accept-Encoding": "identity", **headers})
    return get_session().stream("GET", url, headers=h, timeout=httpx2.Timeout(30.0, read=120.0))


def fetch_range(url: str, name: str, start: int, end: int,
                token: HubToken | None = None) -> bytes:
    """Bytes [start, end) of the file at `url` (memory: end - start); a server that ignores
    Range is read up to `end` only. ConvertError names the file after TRIES failures.
    token: sent instead of this process's own (a Ray task gets the driver's)."""
    import httpx2

    why = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(min(BACKOFF * 2 ** attempt, 8 * BACKOFF))
        body = bytearray()
        try:
            with _session_get(url, {"Range": f"bytes={start}-{end - 1}"}, token) as r:
                if r.status_code not in (200, 206):
                    why = refused(r.status_code)
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


class _Digester:
    """The running SHA-256 of a file and the BLAKE3 digests of its finished blocks."""

    def __init__(self, name: str, size: int, header: bytes) -> None:
        self.name, self.size, self.header = name, size, header
        self.block = block_size(size)
        self.whole, self.digests, self.pending = hashlib.sha256(), bytearray(), bytearray()
        self.got = 0

    def feed(self, chunk: bytes) -> None:
        if self.got + len(chunk) > self.size:
            raise ConvertError(f"{self.name}: the hub sent more than its listed "
                               f"{self.size:,} bytes")
        head = self.header[self.got:self.got + len(chunk)]
        if head and chunk[:len(head)] != head:
            raise ConvertError(f"{self.name}: the file's header differs from the header the hub "
                               "served for planning; rerun to start over")
        self.got += len(chunk)
        self.whole.update(chunk)
        self.pending += chunk
        while len(self.pending) >= self.block:
            self.digests += blake3.blake3(self.pending[:self.block]).digest()
            del self.pending[:self.block]

    def table(self, sha256: str) -> BlockTable:
        if self.pending:
            self.digests += blake3.blake3(self.pending).digest()
            self.pending.clear()
        if self.whole.hexdigest() != sha256:
            raise ConvertError(f"{self.name}: SHA-256 {self.whole.hexdigest()} differs from the "
                               f"hub's {sha256}; rerun the same command to continue")
        return BlockTable(self.name, self.size, self.block, bytes(self.digests))


def stream_digests(url: str, name: str, size: int, sha256: str, header: bytes,
                   on_bytes: Callable[[int], None] | None = None) -> BlockTable:
    """Stream the whole file once (no disk): its SHA-256 must be the hub's, its first bytes the
    header planning used; returns the BLAKE3 digest of every block. A dropped connection goes
    on from the byte it reached (Range), up to TRIES times in a row without progress."""
    import httpx2

    d = _Digester(name, size, header)
    why, failures = "", 0
    while d.got < size and failures < TRIES:
        if failures:
            time.sleep(min(BACKOFF * 2 ** failures, 8 * BACKOFF))
        before = d.got
        try:
            with _session_get(url, {"Range": f"bytes={d.got}-"} if d.got else {}) as r:
                if r.status_code == 200 and d.got:      # Range ignored: from the start again
                    d = _Digester(name, size, header)
                elif r.status_code not in (200, 206) or (r.status_code == 206 and not r.headers
                                                         .get("Content-Range", "")
                                                         .startswith(f"bytes {d.got}-")):
                    why = f"{refused(r.status_code)} {r.headers.get('Content-Range', '')}".strip()
                    if r.status_code in (401, 403, 404):
                        break
                    failures += 1
                    continue
                for chunk in r.iter_bytes():
                    d.feed(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))
        except httpx2.HTTPError as e:
            why = f"{type(e).__name__}: {e}"
        failures = 0 if d.got > before else failures + 1
    if d.got != size:
        raise ConvertError(f"{name}: the hub sent {d.got:,} of its listed {size:,} bytes "
                           f"({why or 'the connection ended early'}); rerun the same command to "
                           "continue")
    return d.table(sha256)
