"""The Hugging Face hub endpoints huggingface_hub calls, served from memory on 127.0.0.1.

Point the client at it with HF_ENDPOINT=server.base. Implemented (as the real hub answers;
`HubRepo.tree` / `HubRepo.info` replace the listing or model info with raw bytes, for hostile
listings):
- GET /api/models/ORG/REPO[/revision/REV]: {"id", "sha", "siblings": [{"rfilename"}]}
- GET /api/models/ORG/REPO/tree/REV[/PATH]?recursive=…: [{"type", "oid", "size", "path",
  "lfs": {"oid", "size", "pointerSize"}}]
- HEAD/GET /ORG/REPO/resolve/REV/FILE: plain files directly, with a git-blob-SHA-1 ETag; LFS files
  302 to /cdn/SHA256 with X-Linked-Etag (the SHA-256) and X-Linked-Size; X-Repo-Commit always.
  The CDN answers Range requests (`tampered_ranges`: the last byte wrong in ranges only).
  Faults (range_server.Fault) are keyed by "/cdn/SHA256" or "/ORG/REPO/resolve/REV/FILE"
  paths: use `fault_path(repo, name)`.
- `HubServer(repos, token=T)`: a private hub: /api and /resolve answer 401 without
  `Authorization: Bearer T` (the CDN's URLs, signed on the real hub, need none); requests that
  sent it are counted per path in `authorized`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from range_server import Body, Fault, LoopbackServer

LFS_THRESHOLD = 1024   # files at least this big are "LFS" here (the hub: 10 MB or *.safetensors)


@dataclass
class HubRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    lfs: set[str] = field(default_factory=set)
    tree: bytes | None = None     # served as the tree listing instead of one built from `files`
    info: bytes | None = None     # served as the model info instead of one built from `files`

    def is_lfs(self, name: str) -> bool:
        return name in self.lfs or len(self.files[name]) >= LFS_THRESHOLD


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


class HubServer(LoopbackServer):
    def __init__(self, repos: dict[str, HubRepo], token: str | None = None) -> None:
        super().__init__()
        self.repos = repos
        self.token = token
        self.authorized: dict[str, int] = {}     # path -> requests that carried the token
        self.cdn: dict[str, bytes] = {}
        self.tampered_ranges: set[str] = set()   # SHA-256s: Range answers end in a wrong byte
        for r in repos.values():
            for name, data in r.files.items():
                if r.is_lfs(name):
                    self.cdn[hashlib.sha256(data).hexdigest()] = data

    def fault_path(self, repo: str, name: str) -> str:
        r = self.repos[repo]
        data = r.files[name]
        if r.is_lfs(name):
            return f"/cdn/{hashlib.sha256(data).hexdigest()}"
        return f"/{repo}/resolve/{r.commit}/{name}"

    def inject(self, repo: str, name: str, fault: Fault) -> None:
        self.faults[self.fault_path(repo, name)] = fault

    def route(self, method: str, path: str, query: dict[str, list[str]],
              handler: BaseHTTPRequestHandler) -> Body:
        p = path.strip("/").split("/")
        if self.token is not None and p[0] != "cdn":
            if handler.headers.get("Authorization") != f"Bearer {self.token}":
                return _error(401, "RepoNotFound", "Invalid credentials in Authorization header")
            self.authorized[path] = self.authorized.get(path, 0) + 1
        if p[:2] == ["api", "models"] and len(p) >= 4:
            return self._api(p[2] + "/" + p[3], p[4:])
        if p[0] == "cdn" and len(p) == 2 and p[1] in self.cdn:
            data = self.cdn[p[1]]
            if p[1] in self.tampered_ranges and handler.headers.get("Range"):
                data = data[:-1] + bytes([data[-1] ^ 0xFF])   # whole-file GETs stay right
            return Body(data, headers={"ETag": f'"{p[1]}"'})
        if len(p) >= 5 and p[2] == "resolve":
            return self._resolve(p[0] + "/" + p[1], p[3], "/".join(p[4:]), handler)
        return _error(404, "EntryNotFound", f"no route {path}")

    def _repo_rev(self, repo_id: str, rev: str) -> HubRepo | Body:
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository {repo_id} not found")
        if rev not in ("main", repo.commit):
            return _error(404, "RevisionNotFound", f"Revision {rev} not found")
        return repo

    def _api(self, repo_id: str, rest: list[str]) -> Body:
        rev = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
        repo = self._repo_rev(repo_id, rev)
        if isinstance(repo, Body):
            return repo
        if rest and rest[0] == "tree" and repo.tree is not None:
            return Body(repo.tree, content_type="application/json")
        if not (rest and rest[0] == "tree") and repo.info is not None:
            return Body(repo.info, content_type="application/json")
        if rest and rest[0] == "tree":
            prefix = "/".join(rest[2:])
            entries = [self._tree_entry(repo, n) for n in sorted(repo.files)
                       if not prefix or n.startswith(prefix + "/")]
            return _json(entries)
        siblings = [{"rfilename": n} for n in sorted(repo.files)]
        return _json({"id": repo_id, "modelId": repo_id, "sha": repo.commit,
                      "siblings": siblings, "private": False})

    def _tree_entry(self, repo: HubRepo, name: str) -> dict:
        data = repo.files[name]
        entry = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": name}
        if repo.is_lfs(name):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
        return entry

    def _resolve(self, repo_id: str, rev: str, name: str,
                 handler: BaseHTTPRequestHandler) -> Body:
        repo = self._repo_rev(repo_id, rev)
        if isinstance(repo, Body):
            return repo
        data = repo.files.get(name)
        if data is None:
            return _error(404, "EntryNotFound", f"{name} not found")
        headers = {"X-Repo-Commit": repo.commit}
        if not repo.is_lfs(name):
            headers["ETag"] = f'"{git_blob_sha1(data)}"'
            return Body(data, headers=headers)
        sha = hashlib.sha256(data).hexdigest()
        headers.update({"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                        "X-Linked-Size": str(len(data)), "Location": f"{self.base}/cdn/{sha}"})
        return Body(b"", 302, headers, "text/plain")


def _json(obj: object) -> Body:
    return Body(json.dumps(obj).encode(), content_type="application/json")


def _error(status: int, code: str, message: str) -> Body:
    return Body(json.dumps({"error": message}).encode(), status,
                {"X-Error-Code": code, "X-Error-Message": message}, "application/json")


__all__ = ["Fault", "HubRepo", "HubServer"]
