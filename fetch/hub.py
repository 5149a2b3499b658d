"""`moepack fetch hf:…`: plan (dry run) and parallel, verified download of a hub checkpoint."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moepack.fetch.errors import FetchError
from moepack.fetch.hub_conversion import conversion_size
from moepack.fetch.hub_download import (
    DownloadPolicy,
    Say,
    content_problem,
    download,
    incomplete_path,
    resolve_url,
    sha256_of,
)
from moepack.fetch.hub_listing import (
    LIST_TIMEOUT_S,
    RemoteFile,
    RepoListing,
    list_repo,
    parse_hf_source,
)
from moepack.fetch.hub_state import VerifiedRecord
from moepack.fetch.lock import dest_lock
from moepack.fetch.manifest import write_manifest
from moepack.fetch.space import SpaceNeed, SpaceVerdict, verdicts

from moepack.safefs import UnsafePathError

COMPLETE, UNVERIFIED, PARTIAL, MISSING = "complete", "unverified", "partial", "missing"
BLOCKED = "blocked"   # a folder stands at the file's name


class _Cancelled(Exception):
    """Another file failed: this one stops where it is (its .incomplete is kept)."""


@dataclass(frozen=True)
class FileState:
    file: RemoteFile
    status: str    # complete (verified), unverified (size right, hashed at fetch), partial, missing
    present: int     # bytes on disk (final file or NAME.incomplete)

    @property
    def to_fetch(self) -> int:
        """Bytes surely downloaded; an unverified file is only if its hash turns out wrong."""
        return 0 if self.status in (COMPLETE, UNVERIFIED) else self.file.size - self.present


@dataclass(frozen=True)
class HubPlan:
    listing: RepoListing
    dest: Path
    files: tuple[FileState, ...]
    conversion: int | None
    conversion_note: str
    verdicts: tuple[SpaceVerdict, ...]
    redownload: int = 0   # space counted for unverified files that may differ (see _redownload)

    @property
    def to_fetch(self) -> int:
        return sum(s.to_fetch for s in self.files)

    @property
    def unverified(self) -> list[FileState]:
        return [s for s in self.files if s.status == UNVERIFIED]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts) and not self.blocked

    @property
    def blocked(self) -> list[Path]:
        """Where a folder stands at a file's name (the download could never be put there)."""
        return [self.dest / s.file.name for s in self.files if s.status == BLOCKED]


@dataclass(frozen=True)
class HubResult:
    manifest: Path
    downloaded: int       # bytes received in this run (estimate: file sizes minus resumed bytes)
    files: int


def _state(f: RemoteFile, dest: Path, record: VerifiedRecord) -> FileState:
    path = dest / f.name
    if os.path.isdir(path):   # the final rename could not replace it: found before downloading
        return FileState(f, BLOCKED, 0)
    if path.is_file():
        size = path.stat().st_size
        if size == f.size:
            verified = record.verified(f) is not None
            return FileState(f, COMPLETE if verified else UNVERIFIED, size)
    part = incomplete_path(path)
    if part.is_file() and part.stat().st_size <= f.size:
        return FileState(f, PARTIAL, part.stat().st_size)
    return FileState(f, MISSING, 0)


def _redownload(states: tuple[FileState, ...], jobs: int) -> int:
    """Room for unverified files whose hash may turn out wrong: each is downloaded next to its
    old copy, which goes only when the new one verifies, and at most `jobs` run at once."""
    sizes = sorted((s.file.size for s in states if s.status == UNVERIFIED), reverse=True)
    return sum(sizes[:jobs])


def plan_hub(source: str, dest: Path, includes: list[str], out: Path | None = None, *,
             jobs: int = 4, list_timeout: float = LIST_TIMEOUT_S) -> HubPlan:
    repo, revision = parse_hf_source(source)
    dest = Path(dest).absolute()
    listing = list_repo(repo, revision, includes, list_timeout)
    record = VerifiedRecord(dest)
    states = tuple(_state(f, dest, record) for f in listing.files)
    conv, note = conversion_size(listing, dest)
    redownload = _redownload(states, jobs)
    needs = [SpaceNeed("download", dest, sum(s.to_fetch for s in states) + redownload)]
    if conv is not None:
        needs.append(SpaceNeed("conversion output", Path(out).absolute() if out else dest, conv))
    return HubPlan(listing, dest, states, conv, note, tuple(verdicts(needs)), redownload)


STOP_GRACE_S = 1.0   # on Ctrl-C, how long workers get to reach their next chunk


def fetch_hub(plan: HubPlan, *, jobs: int = 4, policy: DownloadPolicy | None = None,
              on_bytes: Callable[[int], None] | None = None,
              on_hashing: Callable[[int], None] | None = None,
              say: Say | None = None) -> HubResult:
    """Download what the plan says is missing, check every file, then write the manifest.

    `on_bytes(n)` is told of bytes fetched or found already on disk (negative when bytes are
    thrown away and fetched again: a file on disk or a download that fails its hash, a server
    that ignores Range), so the sum never passes the listing's total; `on_hashing(n)` of how
    many existing files are being hashed now; `say(line)` of each retry and re-download."""
    if plan.blocked:
        raise FetchError(f"{plan.blocked[0]} is a folder where the hub has a file; move it away "
                         "(nothing downloaded)")
    policy = policy or DownloadPolicy()
    dest, listing = plan.dest, plan.listing
    record = VerifiedRecord(dest)
    stop = threading.Event()
    hashing = [0]
    hashing_lock = threading.Lock()

    def count(n: int) -> None:
        # Runs in the download and hashing loops: after the first failure (or Ctrl-C) the
        # other files stop at their next chunk, keeping their .incomplete for the rerun.
        if stop.is_set():
            raise _Cancelled
        if on_bytes:
            on_bytes(n)

    def hashing_by(d: int) -> None:
        with hashing_lock:
            hashing[0] += d
            if on_hashing:
                on_hashing(hashing[0])

    def existing_sha(f: RemoteFile, path: Path) -> str | None:
        hashing_by(1)
        try:
            sha = sha256_of(path, count).hexdigest()
        finally:
            hashing_by(-1)
        problem = content_problem(f, path, sha)
        if problem is None:
            record.checked(f, sha)
            return sha
        if say:
            say(f"{f.name}: the copy on disk differs ({problem}); downloading it (the copy "
                "stays until the download verifies)")
        count(-f.size)   # counted while hashing; it is downloaded after all
        return None

    def one(state: FileState) -> tuple[str, int, str]:
        count(0)
        f = state.file
        path = dest / f.name
        sha = record.verified(f) if state.status == COMPLETE else None
        if sha is not None:
            count(f.size)
            return f.name, f.size, sha
        try:   # disk full, a planted link or file, unreadable copy on disk: one clear line
            if state.status in (COMPLETE, UNVERIFIED):
                sha = existing_sha(f, path)
                if sha is not None:
                    return f.name, f.size, sha
            url = resolve_url(listing.repo, listing.revision, f.name)
            sha = download(f, url, dest, policy, count, say)
            record.checked(f, sha)
        except (OSError, UnsafePathError) as e:
            raise FetchError(f"{f.name}: {e}") from e
        return f.name, f.size, sha

    with dest_lock(dest):
        # Looked at again under the lock: a fetch that finished between the plan and now has
        # verified files the plan saw missing or partial (they are not downloaded again), and
        # its record of them is kept, not overwritten by the one read before.
        record = VerifiedRecord(dest)
        states = [_state(s.file, dest, record) for s in plan.files]
        outcomes = _run_workers(states, one, jobs, stop)
        errors = [e for e in outcomes
                  if isinstance(e, BaseException) and not isinstance(e, _Cancelled)]
        if errors:
            first = errors[0]
            if isinstance(first, FetchError):
                more = f" (and {len(errors) - 1} more failed files)" if len(errors) > 1 else ""
                raise FetchError(f"{first}{more}") from first
            raise first
        done = [o for o in outcomes if not isinstance(o, BaseException)]
        try:  # still locked: a later fetch into DEST never sees its files under our manifest
            manifest = write_manifest(dest, listing.repo, listing.revision, done)
        except (OSError, UnsafePathError) as e:
            raise FetchError(f"cannot write the manifest in {dest}: {e}") from e
    return HubResult(manifest, plan.to_fetch, len(done))


def _run_workers(states: list[FileState], one: Callable[[FileState], tuple[str, int, str]],
                 jobs: int, stop: threading.Event) -> list[tuple[str, int, str] | BaseException]:
    """`one` over `states` on `jobs` daemon threads; each outcome is a result or the exception.

    The first failure sets `stop`, and the others stop at their next chunk. On Ctrl-C the main
    thread waits STOP_GRACE_S for that, then leaves: a worker blocked in a read of a stalled
    server would hold it for up to --stall-timeout, and being a daemon it dies with the process
    (bytes it wrote stay in NAME.incomplete; a rerun rehashes them)."""
    outcomes: list[tuple[str, int, str] | BaseException] = [_Cancelled() for _ in states]
    todo = iter(range(len(states)))
    todo_lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            with todo_lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                outcomes[i] = one(states[i])
            except BaseException as e:  # noqa: BLE001 — handed to the main thread
                outcomes[i] = e
                if not isinstance(e, _Cancelled):
                    stop.set()

    threads = [threading.Thread(target=worker, daemon=True, name=f"fetch-{n}")
               for n in range(max(1, min(jobs, len(states))))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)   # short joins: Ctrl-C reaches this thread at once
    except KeyboardInterrupt:
        stop.set()
        deadline = time.monotonic() + STOP_GRACE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        raise
    return outcomes
