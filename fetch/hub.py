"""`moepack fetch hf:…`: plan (dry run) and parallel, verified download of a hub checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
from moepack.fetch.manifest import write_manifest
from moepack.fetch.space import SpaceNeed, SpaceVerdict, verdicts

COMPLETE, UNVERIFIED, PARTIAL, MISSING = "complete", "unverified", "partial", "missing"


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
    dest.mkdir(parents=True, exist_ok=True)
    record = VerifiedRecord(dest)

    def one(state: FileState) -> tuple[str, int, str]:
        f = state.file
        path = dest / f.name
        if state.status == COMPLETE:
            sha = record.sha256(f.name)
            if sha is not None:
                if on_bytes:
                    on_bytes(f.size)
                return f.name, f.size, sha
        if state.status in (COMPLETE, UNVERIFIED):
            sha = sha256_of(path).hexdigest()
            if content_problem(f, path, sha) is None:
                record.add(f.name, sha)
                if on_bytes:
                    on_bytes(f.size)
                return f.name, f.size, sha
        url = resolve_url(listing.repo, listing.revision, f.name)
        sha = download(f, url, path, policy, on_bytes)
        record.add(f.name, sha)
        return f.name, f.size, sha

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, s) for s in plan.files]
        errors = [fu.exception() for fu in futures if fu.exception() is not None]
    if errors:
        first = errors[0]
        if isinstance(first, FetchError):
            more = f" (and {len(errors) - 1} more failed files)" if len(errors) > 1 else ""
            raise FetchError(f"{first}{more}") from first
        raise first
    done = [fu.result() for fu in futures]
    manifest = write_manifest(dest, listing.repo, listing.revision, done)
    return HubResult(manifest, plan.to_fetch, len(done))
