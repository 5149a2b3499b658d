"""What a hub repository holds at one revision: names, sizes, LFS SHA-256, commit."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from moepack.fetch.errors import FetchError
from moepack.fetch.staging import STAGING_DIR

from moepack.safefs import name_problem, printable
from moepack.untrusted_json import loads

_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")   # SHA-1, or SHA-256 object format
_COMMIT = _GIT_OID
LIST_TIMEOUT_S = 120.0   # huggingface_hub lists trees with no timeout at all
# Bounds on what a hub may declare (the largest public checkpoints: ~200 files, ~1.5 TB).
MAX_ENTRIES = 100_000
MAX_PAGES = 1_000
MAX_PAGE_BYTES = 64 << 20
JSON_DEPTH = 16                   # a hub tree entry is 3 deep; fetch's state files 2
MAX_PATH_BYTES = 1024
MAX_FILE_BYTES = 1 << 46          # 64 TiB
MAX_TOTAL_BYTES = 1 << 50         # 1 PiB
INCOMPLETE = ".incomplete"        # hub_download's partial files
RESERVED = (STAGING_DIR, "moepack-source.json")   # fetch's own state and manifest


@dataclass(frozen=True)
class RemoteFile:
    name: str               # checked by safe_name: plain components, safe to print and join
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


def safe_name(name: object, repo: str) -> str:
    """A listed path, each '/'-separated component a plain file name (safefs.name_problem):
    no '.', '..', empty component (so no absolute path), backslash or control character."""
    if not isinstance(name, str):
        raise FetchError(f"{repo}: hub listing: 'path' is {_kind(name)}, not a string")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise FetchError(f"{repo}: hub listing: path {printable(name, 80)} is longer than "
                         f"{MAX_PATH_BYTES} bytes")
    for part in name.split("/"):
        problem = name_problem(part)
        if problem:
            raise FetchError(f"{repo}: unsafe file name {printable(name)} in the hub listing: "
                             f"component {printable(part)} {problem}")
    if name.split("/")[0] in RESERVED or name.endswith(INCOMPLETE):
        raise FetchError(f"{repo}: hub listing names {printable(name)}, which moepack fetch "
                         "uses for its own files")
    return name


_JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
               list: "an array", dict: "an object"}


def _kind(value: object) -> str:
    """The JSON kind of a parsed value, for messages."""
    return _JSON_KINDS.get(type(value), "null")


def _field(entry: dict, key: str, want: type | tuple[type, ...], where: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, want) or isinstance(value, bool):
        raise FetchError(f"{where}: {key!r} is {_kind(value)}, expected "
                         f"{_WANT.get(want, 'a string')}")
    return value


_WANT: dict[Any, str] = {int: "an integer", dict: "an object"}


def _size(entry: dict, where: str) -> int:
    size = _field(entry, "size", int, where)
    if not 0 <= size <= MAX_FILE_BYTES:
        raise FetchError(f"{where}: 'size' {size} is outside 0..{MAX_FILE_BYTES}")
    return size


def _lfs_sha256(entry: dict, size: int, where: str) -> str | None:
    lfs = entry.get("lfs")
    if lfs is None:
        return None
    lfs = _field(entry, "lfs", dict, where)
    sha = _field(lfs, "oid", str, f"{where}: 'lfs'").lower()
    if not _SHA256.fullmatch(sha):
        raise FetchError(f"{where}: malformed LFS sha256 {printable(sha, 80)}")
    if "size" in lfs and _field(lfs, "size", int, f"{where}: 'lfs'") != size:
        raise FetchError(f"{where}: 'lfs' size {lfs['size']} differs from 'size' {size}")
    return sha


class TreeReader:
    """Checks tree entries page by page: types, names, duplicates, counts and total size."""

    def __init__(self, repo: str) -> None:
        self.repo = repo
        self.files: dict[str, RemoteFile] = {}
        self.folders: set[str] = set()
        self.entries = 0

    def add_page(self, page: object) -> None:
        if not isinstance(page, list):
            raise FetchError(f"{self.repo}: hub listing page is {_kind(page)}, not a list")
        for entry in page:
            self.entries += 1
            if self.entries > MAX_ENTRIES:
                raise FetchError(f"{self.repo}: hub listing has more than {MAX_ENTRIES} entries")
            self._add(entry, f"{self.repo}: hub listing entry {self.entries}")

    def _add(self, entry: object, where: str) -> None:
        if not isinstance(entry, dict):
            raise FetchError(f"{where} is {_kind(entry)}, not an object")
        kind = _field(entry, "type", str, where)
        if kind not in ("file", "directory"):
            raise FetchError(f"{where}: 'type' {printable(kind, 40)} is neither file nor directory")
        name = safe_name(entry.get("path"), self.repo)
        where = f"{self.repo}: hub listing entry {printable(name)}"
        if kind == "directory":
            return
        if name in self.files:
            raise FetchError(f"{where} is listed twice")
        size = _size(entry, where)
        blob = _field(entry, "oid", str, where)
        if not _GIT_OID.fullmatch(blob):
            raise FetchError(f"{where}: malformed git 'oid' {printable(blob, 80)}")
        self.files[name] = RemoteFile(name, size, _lfs_sha256(entry, size, where), blob)
        self.folders.update("/".join(name.split("/")[:i]) for i in range(1, name.count("/") + 1))

    def result(self, includes: list[str]) -> list[RemoteFile]:
        """The files matching `includes` (all when empty), after whole-listing checks."""
        clash = sorted(self.folders & self.files.keys())
        if clash:
            raise FetchError(f"{self.repo}: hub listing has {printable(clash[0])} both as a file "
                             "and as a folder")
        total = sum(f.size for f in self.files.values())
        if total > MAX_TOTAL_BYTES:
            raise FetchError(f"{self.repo}: hub listing totals {total} bytes, more than "
                             f"{MAX_TOTAL_BYTES}")
        return [f for name, f in sorted(self.files.items())
                if not includes or any(fnmatch.fnmatch(name, g) for g in includes)]


def parse_tree(body: bytes, repo: str, includes: list[str] = []) -> list[RemoteFile]:  # noqa: B006
    """One page of a tree listing (bytes as the hub sent them) to checked files."""
    reader = TreeReader(repo)
    reader.add_page(loads(body, f"{repo}: hub listing", max_bytes=MAX_PAGE_BYTES,
                           max_depth=JSON_DEPTH, error=FetchError))
    return reader.result(includes)

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


def _get(url: str, what: str, timeout: float,
         params: dict[str, str] | None = None) -> tuple[object, str | None]:
    """GET one JSON document (at most MAX_PAGE_BYTES) -> (parsed, next page URL or None)."""
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    headers = build_hf_headers(token=os.environ.get("HF_TOKEN") or None)
    t = httpx2.Timeout(30.0, read=timeout)
    body = bytearray()
    with get_session().stream("GET", url, params=params, headers=headers, timeout=t,
                              follow_redirects=True) as r:
        if r.status_code != 200:
            why = r.headers.get("X-Error-Message") or r.reason_phrase
            raise FetchError(f"{what} on {endpoint()}: HTTP {r.status_code} "
                             f"{printable(why, 160)}")
        for chunk in r.iter_bytes():   # streamed: a hostile hub cannot make us hold more
            body += chunk
            if len(body) > MAX_PAGE_BYTES:
                raise FetchError(f"{what}: hub answer larger than {MAX_PAGE_BYTES} bytes")
        nxt = r.links.get("next", {}).get("url")
    return loads(bytes(body), f"{what}: hub answer", max_bytes=MAX_PAGE_BYTES,
                 max_depth=JSON_DEPTH, error=FetchError), nxt


def _commit(doc: object, what: str) -> str:
    sha = doc.get("sha") if isinstance(doc, dict) else None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        shown = printable(sha, 80) if isinstance(sha, str) else _kind(sha)
        raise FetchError(f"{what}: the hub did not say which commit it is ('sha' is {shown})")
    return sha


def _ask(repo: str, revision: str, timeout: float) -> list:
    """[commit, TreeReader] for `repo` at `revision`, following the tree's pages."""
    what = f"{repo}@{revision}"
    base = f"{endpoint()}/api/models/{repo}"
    info, _ = _get(f"{base}/revision/{quote(revision, safe='')}", what, timeout)
    commit = _commit(info, what)
    reader = TreeReader(repo)
    url: str | None = f"{base}/tree/{commit}"
    params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
    for _ in range(MAX_PAGES):
        if url is None:
            return [commit, reader]
        if not url.startswith(endpoint() + "/"):   # the token must not go to another host
            raise FetchError(f"{what}: the hub's next page {printable(url, 120)} is elsewhere")
        page, url = _get(url, what, timeout, params)
        params = None   # the next link carries its own query
        reader.add_page(page)
    raise FetchError(f"{what}: hub listing has more than {MAX_PAGES} pages")


def list_repo(repo: str, revision: str, includes: list[str],
              timeout: float = LIST_TIMEOUT_S) -> RepoListing:
    """Resolve `revision` to a commit and list its files (filtered by `includes` globs).

    Read here rather than by huggingface_hub's listing, so that every answer is bounded
    (bytes, depth, entries, pages) and checked field by field before it is used."""
    import httpx2

    try:
        commit, reader = _bounded(lambda: _ask(repo, revision, timeout), timeout,
                                  f"listing {repo}@{revision}")
    except (OSError, httpx2.HTTPError) as e:
        raise FetchError(f"{repo}@{revision}: cannot reach {endpoint()}: "
                         f"{printable(str(e), 160)}") from e
    files = reader.result(includes)
    if not files:
        which = f" match {includes}" if includes else ""
        raise FetchError(f"{repo}@{revision}: no files{which}")
    return RepoListing(repo, commit, tuple(files))
