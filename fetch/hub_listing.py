"""What a hub repository holds at one revision: names, sizes, LFS SHA-256, commit."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from moepack.fetch.errors import FetchError

_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
LIST_TIMEOUT_S = 120.0   # huggingface_hub lists trees with no timeout at all


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None      # LFS files: the hub's SHA-256 of the content; plain git files: None
    blob_id: str            # git blob SHA-1 (what plain files' ETag carries)


@dataclass(frozen=True)
class RepoListing:
    repo: str
    revision: str           # the commit hash the listing (and every download) is pinned to
    files: tuple[RemoteFile, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


def parse_hf_source(source: str) -> tuple[str, str]:
    """'hf:ORG/REPO[@REV]' -> (repo, revision)."""
    body = source.removeprefix("hf:")
    repo, _, rev = body.partition("@")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise FetchError(f"{source!r}: expected hf:ORG/REPO[@REVISION]")
    return repo, rev or "main"


def endpoint() -> str:
    """HF_ENDPOINT read now, not at import time (huggingface_hub freezes it when imported)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_api():  # -> huggingface_hub.HfApi
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=os.environ.get("HF_TOKEN") or None)


def safe_name(name: str, repo: str) -> str:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name or "\x00" in name:
        raise FetchError(f"{repo}: unsafe file name {name!r} in the hub listing")
    return str(p)


def _bounded(fn: Callable[[], list], seconds: float, what: str) -> list:
    """Run `fn` in a daemon thread; FetchError if it has not returned within `seconds`."""
    box: list = []

    def run() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 — handed to the caller's thread
            box.append(("err", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if not box:
        raise FetchError(f"{what}: no answer from {endpoint()} within {seconds:.0f} s")
    kind, value = box[0]
    if kind == "err":
        raise value
    return value


def list_repo(repo: str, revision: str, includes: list[str],
              timeout: float = LIST_TIMEOUT_S) -> RepoListing:
    """Resolve `revision` to a commit and list its files (filtered by `includes` globs)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.hf_api import RepoFile

    api = hub_api()

    def ask() -> list:
        commit = api.model_info(repo, revision=revision, timeout=timeout).sha
        if not commit:
            raise FetchError(f"{repo}@{revision}: the hub did not say which commit it is")
        return [commit, list(api.list_repo_tree(repo, revision=commit, recursive=True))]

    try:
        commit, entries = _bounded(ask, timeout, f"listing {repo}@{revision}")
    except HfHubHTTPError as e:
        raise FetchError(f"{repo}@{revision} on {endpoint()}: {_first_line(e)}") from e
    except (OSError, httpx2.HTTPError) as e:
        raise FetchError(f"{repo}@{revision}: cannot reach {endpoint()}: {e}") from e
    files = []
    for e in entries:
        if not isinstance(e, RepoFile):
            continue   # a folder
        name = safe_name(e.path, repo)
        if includes and not any(fnmatch.fnmatch(name, g) for g in includes):
            continue
        sha = e.lfs.sha256.lower() if e.lfs is not None else None
        if sha is not None and not _SHA256.fullmatch(sha):
            raise FetchError(f"{repo}: malformed LFS sha256 {sha[:80]!r} for {name}")
        files.append(RemoteFile(name, int(e.size), sha, e.blob_id))
    if not files:
        which = f" match {includes}" if includes else ""
        raise FetchError(f"{repo}@{revision}: no files{which}")
    return RepoListing(repo, commit, tuple(sorted(files, key=lambda f: f.name)))


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
