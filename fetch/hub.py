"""`moepack fetch hf:…`: plan (dry run) and parallel, verified download of a hub checkpoint."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from moepack.fetch.errors import FetchError
from moepack.fetch.hub_conversion import conversion_size
from moepack.fetch.hub_download import (
    DownloadPolicy,
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


class _Cancelled(Exception):
    """Another file failed: this one stops where it is (its .incomplete is kept)."""


@dataclass(frozen=True)
class FileState:
    file: RemoteFile
    status: str    # complete (verified), unverified (size right, hashed at fetch), partial, missing
    present: int     # bytes on disk (final file or NAME.incomplete)

    @property
    def to_fetch(self) -> int:
        return 0 if self.status in (COMPLETE, UNVERIFIED) else self.file.size - self.present


@dataclass(frozen=True)
class HubPlan:
    listing: RepoListing
    dest: Path
    files: tuple[FileState, ...]
    conversion: int | None
    conversion_note: str
    verdicts: tuple[SpaceVerdict, ...]

    @property
    def to_fetch(self) -> int:
        return sum(s.to_fetch for s in self.files)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


@dataclass(frozen=True)
class HubResult:
    manifest: Path
    downloaded: int       # bytes received in this run (estimate: file sizes minus resumed bytes)
    files: int


def _state(f: RemoteFile, dest: Path, record: VerifiedRecord) -> FileState:
    path = dest / f.name
    if path.is_file():
        size = path.stat().st_size
        if size == f.size:
            sha = record.sha256(f.name)
            ok = sha is not None and (f.sha256 is None or sha == f.sha256)
            return FileState(f, COMPLETE if ok else UNVERIFIED, size)
    part = incomplete_path(path)
    if part.is_file() and part.stat().st_size <= f.size:
        return FileState(f, PARTIAL, part.stat().st_size)
    return FileState(f, MISSING, 0)


def plan_hub(source: str, dest: Path, includes: list[str], out: Path | None = None, *,
             list_timeout: float = LIST_TIMEOUT_S) -> HubPlan:
    repo, revision = parse_hf_source(source)
    dest = Path(dest).absolute()
    listing = list_repo(repo, revision, includes, list_timeout)
    record = VerifiedRecord(dest)
    states = tuple(_state(f, dest, record) for f in listing.files)
    conv, note = conversion_size(listing, dest)
    needs = [SpaceNeed("download", dest, sum(s.to_fetch for s in states))]
    if conv is not None:
        needs.append(SpaceNeed("conversion output", Path(out).absolute() if out else dest, conv))
    return HubPlan(listing, dest, states, conv, note, tuple(verdicts(needs)))


def fetch_hub(plan: HubPlan, *, jobs: int = 4, policy: DownloadPolicy | None = None,
              on_bytes: Callable[[int], None] | None = None) -> HubResult:
    """Download what the plan says is missing, check every file, then write the manifest."""
    policy = policy or DownloadPolicy()
    dest, listing = plan.dest, plan.listing
    record = VerifiedRecord(dest)
    stop = threading.Event()

    def count(n: int) -> None:
        # Runs in the download loops: after the first failure (or Ctrl-C) the other files stop
        # at their next chunk, keeping their .incomplete for the rerun, instead of running on.
        if stop.is_set():
            raise _Cancelled
        if on_bytes:
            on_bytes(n)

    def one(state: FileState) -> tuple[str, int, str]:
        count(0)
        f = state.file
        path = dest / f.name
        sha = record.sha256(f.name) if state.status == COMPLETE else None
        if sha is None and state.status in (COMPLETE, UNVERIFIED):
            sha = sha256_of(path).hexdigest()
            if content_problem(f, path, sha) is None:
                record.add(f.name, sha)
            else:
                sha = None
        if sha is not None:
            count(f.size)
            return f.name, f.size, sha
        url = resolve_url(listing.repo, listing.revision, f.name)
        try:
            sha = download(f, url, dest, policy, count)
            record.add(f.name, sha)
        except (OSError, UnsafePathError) as e:   # disk full, a planted link: one clear line
            raise FetchError(f"{f.name}: {e}") from e
        return f.name, f.size, sha

    with dest_lock(dest), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, s) for s in plan.files]
        try:
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:   # Ctrl-C: stop the workers too
            stop.set()
            raise
        if any(fu.exception() is not None for fu in finished):
            stop.set()
            for fu in futures:
                fu.cancel()
    errors = [e for fu in futures if not fu.cancelled() and (e := fu.exception()) is not None
              and not isinstance(e, _Cancelled)]
    if errors:
        first = errors[0]
        if isinstance(first, FetchError):
            more = f" (and {len(errors) - 1} more failed files)" if len(errors) > 1 else ""
            raise FetchError(f"{first}{more}") from first
        raise first
    done = [fu.result() for fu in futures]
    try:
        manifest = write_manifest(dest, listing.repo, listing.revision, done)
    except (OSError, UnsafePathError) as e:
        raise FetchError(f"cannot write the manifest in {dest}: {e}") from e
    return HubResult(manifest, plan.to_fetch, len(done))
