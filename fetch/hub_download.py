"""One hub file to disk: resumable, size- and SHA-256-checked, atomic.

Bytes go to NAME.incomplete (hashed as they arrive, so a 1 TB repository is read once) and
are renamed to NAME only after size and hash match. A dropped connection resumes with a Range
request; a stalled one times out after `read_timeout`; 429 and 5xx answers are retried like
drops (waiting out Retry-After up to a minute); a hash mismatch restarts the file, and
after `attempts` mismatches the download fails naming the file, both hashes and the URL.
Each retry is said in one line (`say`), and bytes fetched again are first taken back from
the progress count (`on_bytes` with a negative number), so a bar never passes its total.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moepack.fetch.errors import FetchError
from moepack.fetch.hub_listing import RemoteFile, endpoint

from moepack.safefs import UnsafePathError, ensure_dir, open_existing, open_new

CHUNK = 1 << 20
NET_RETRIES = 5        # consecutive network failures without a byte of progress
RETRY_STATUS = (429, 500, 502, 503, 504)   # overload or a passing fault: tried again
MAX_RETRY_AFTER_S = 60.0                   # a longer Retry-After is not waited out in full

OnBytes = Callable[[int], None]
Say = Callable[[str], None]   # one line about a retry (what file, why, which try)


class _Busy(Exception):
    """A retryable HTTP status; `url` is the one that answered (after redirects)."""

    def __init__(self, status: int, url: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.url, self.retry_after = status, url, retry_after


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None if unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class DownloadPolicy:
    read_timeout: float = 120.0
    attempts: int = 3          # full downloads allowed when the hash does not match
    backoff: float = 1.0       # seconds, doubled per consecutive network failure (max 8)


def resolve_url(repo: str, revision: str, name: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, name, revision=revision, endpoint=endpoint())


def _feed(h: hashlib._Hash, path: Path,
          on_chunk: Callable[[int], None] | None = None) -> hashlib._Hash:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if on_chunk:
                on_chunk(len(chunk))   # progress, and a cancellation point (it may raise)
    return h


def sha256_of(path: Path, on_chunk: Callable[[int], None] | None = None) -> hashlib._Hash:
    """The running SHA-256 of a file (a hash object: a resumed download keeps feeding it).
    `on_chunk(n)` is told of each chunk hashed and may raise to stop."""
    return _feed(hashlib.sha256(), path, on_chunk)


def git_blob_sha1(path: Path) -> str:
    """The hash git (and the hub's ETag) gives a plain file."""
    return _feed(hashlib.sha1(b"blob %d\x00" % path.stat().st_size), path).hexdigest()


def content_problem(f: RemoteFile, path: Path, sha256: str) -> str | None:
    """None when `path` (whose SHA-256 is `sha256`) is the hub's file, else what differs."""
    size = path.stat().st_size
    if size != f.size:
        return f"{size} bytes, the hub lists {f.size}"
    if f.sha256 is not None and sha256 != f.sha256:
        return f"SHA-256 {sha256} does not match the hub's {f.sha256}"
    if f.sha256 is None and git_blob_sha1(path) != f.blob_id:
        return f"git blob hash does not match the hub's {f.blob_id}"
    return None


def incomplete_path(target: Path) -> Path:
    return target.with_name(target.name + ".incomplete")


def make_folders(dest: Path, name: str) -> Path:
    """dest/name after creating its listed subfolders one by one; a link or a file where a
    folder belongs is refused (ensure_dir), so no write leaves `dest` through a planted link."""
    folder = dest
    for part in name.split("/")[:-1]:
        folder = ensure_dir(folder / part)
    return folder / name.rsplit("/", 1)[-1]


def download(f: RemoteFile, url: str, dest: Path, policy: DownloadPolicy,
             on_bytes: OnBytes | None = None, say: Say | None = None) -> str:
    """Download `f` to dest/f.name; returns its SHA-256 hex (checked against the hub's if LFS).

    `on_bytes(n)` is told of every chunk (and of 0 before each request; of minus the bytes
    thrown away when the file starts over); raising from it aborts the download and keeps
    NAME.incomplete for a later resume. `say(line)` is told of each retry."""
    target = make_folders(dest, f.name)
    part = incomplete_path(target)
    for attempt in range(1, policy.attempts + 1):
        digest = _fill(f, url, part, policy, on_bytes, say)
        problem = content_problem(f, part, digest)
        if problem is None:
            os.replace(part, target)
            return digest
        part.unlink()
        if attempt == policy.attempts:
            raise FetchError(f"{f.name}: {problem} after {attempt} downloads from "
                             f"{url}")
        _tell(on_bytes, say, f.size, f"{f.name}: {problem}; downloading it again "
              f"(download {attempt + 1} of {policy.attempts})")
    raise AssertionError("unreachable")


def _tell(on_bytes: OnBytes | None, say: Say | None, thrown: int, line: str) -> None:
    """Say that the file starts over, and take the bytes thrown away back from the progress
    count: they are fetched again, not progress past the total."""
    if say:
        say(line)
    if on_bytes and thrown:
        on_bytes(-thrown)


class _Partial:
    """NAME.incomplete and the running SHA-256 of the bytes it holds."""

    def __init__(self, path: Path, size: int, on_bytes: OnBytes | None = None) -> None:
        self.path = path
        self.have = _partial_size(path)
        if self.have > size:        # not ours or from another revision: start over
            path.unlink()
            self.have = 0
        self.h = sha256_of(path, on_bytes) if self.have else hashlib.sha256()

    def restart(self) -> int:
        """Start over at byte 0; returns the bytes thrown away."""
        thrown, self.have, self.h = self.have, 0, hashlib.sha256()
        return thrown

    def open(self) -> int:
        """A descriptor to append at `have`: a new inode when starting over (a link or stale
        file there is removed, never written through), else the existing regular file."""
        if self.have:
            return open_existing(self.path, os.O_WRONLY)
        return open_new(self.path, os.O_WRONLY, replace=True)


def _partial_size(path: Path) -> int:
    """Bytes in NAME.incomplete (0 if absent); a link or non-file there is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path} is a symbolic link or not a regular file; refusing to "
                              "write through it (move it away)")
    return st.st_size


def _why(problem: Exception | None, url: str) -> str:
    """What went wrong with one request, naming the URL that answered."""
    if isinstance(problem, _Busy):
        return f"{problem} from {problem.url}"
    return f"{type(problem).__name__ if problem else 'no data'} from {url}"


def _fill(f: RemoteFile, url: str, part_path: Path, policy: DownloadPolicy,
          on_bytes: OnBytes | None, say: Say | None = None) -> str:
    """Bring NAME.incomplete to f.size bytes, resuming; returns the SHA-256 of its content."""
    import httpx2

    part = _Partial(part_path, f.size, on_bytes)   # counts the resumed bytes as it hashes them
    failures = 0
    while part.have < f.size:
        if on_bytes:
            on_bytes(0)   # a cancellation point before each request (the callback may raise)
        before = part.have
        problem: Exception | None = None
        try:
            _stream(f, url, part, policy, on_bytes, say)
        except (httpx2.TransportError, httpx2.TimeoutException, _Busy) as e:
            problem = e
        except httpx2.TooManyRedirects as e:
            raise FetchError(f"{f.name}: too many redirects from {url} (a redirect loop?)") from e
        if part.have >= f.size:
            break
        if part.have > before:
            failures = 0
            if say:   # a truncated body: resumed at once, with a Range request
                cut = _why(problem, url) if problem else f"the answer from {url} ended early"
                say(f"{f.name}: {cut} after {part.have} of {f.size} bytes; resuming from there")
            continue
        failures += 1   # no progress: a stall, a refused connection, a short body, a 5xx
        if failures > NET_RETRIES:
            raise FetchError(f"{f.name}: {_why(problem, url)} after {failures} tries "
                             f"({part.have} of {f.size} bytes kept in {part_path}; "
                             "rerun resumes)") from problem
        wait = min(policy.backoff * 2 ** (failures - 1), 8.0)
        if isinstance(problem, _Busy) and problem.retry_after is not None:
            wait = max(wait, min(problem.retry_after, MAX_RETRY_AFTER_S))
        if say:
            say(f"{f.name}: {_why(problem, url)}; try {failures + 1} of {NET_RETRIES + 1} "
                f"in {wait:.3g} s")
        _sleep(wait, on_bytes)
    return part.h.hexdigest()


def _sleep(seconds: float, on_bytes: OnBytes | None) -> None:
    """Back off, checking for cancellation (on_bytes(0) may raise) every 0.2 s."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.2))
        if on_bytes:
            on_bytes(0)


def _stream(f: RemoteFile, url: str, part: _Partial, policy: DownloadPolicy,
            on_bytes: OnBytes | None, say: Say | None) -> None:
    """One GET from part.have on, appending to the file. Network errors propagate."""
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    headers = build_hf_headers(token=os.environ.get("HF_TOKEN") or None)
    headers["Accept-Encoding"] = "identity"    # sizes and Range refer to the stored bytes
    if part.have:
        headers["Range"] = f"bytes={part.have}-"
    timeout = httpx2.Timeout(30.0, read=policy.read_timeout)
    with get_session().stream("GET", url, headers=headers, timeout=timeout) as r:
        answered = str(r.url)   # the CDN's after a redirect
        if r.status_code == 404:
            raise FetchError(f"{f.name}: not found at {answered} (404)")
        if r.status_code in RETRY_STATUS:
            raise _Busy(r.status_code, answered, _retry_after(r.headers.get("Retry-After")))
        if r.status_code not in (200, 206):
            raise FetchError(f"{f.name}: HTTP {r.status_code} from {answered}")
        if part.have and r.status_code == 200:   # Range ignored: the body starts at byte 0
            _tell(on_bytes, say, part.restart(), f"{f.name}: {answered} ignored the Range "
                  "request; downloading the file from its first byte")
        elif part.have and not r.headers.get("Content-Range", "").startswith(
                f"bytes {part.have}-"):
            raise FetchError(f"{f.name}: asked {url} for bytes {part.have}-, got "
                             f"{r.headers.get('Content-Range')!r}")
        with os.fdopen(part.open(), "wb") as out:
            out.seek(part.have)
            out.truncate()
            for chunk in r.iter_bytes():   # as received: a drop loses no buffered bytes
                if part.have + len(chunk) > f.size:
                    raise FetchError(f"{f.name}: {url} sent more than the listed {f.size} "
                                     "bytes")
                out.write(chunk)
                out.flush()   # on disk as counted: a worker left blocked at exit loses nothing
                part.h.update(chunk)
                part.have += len(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
