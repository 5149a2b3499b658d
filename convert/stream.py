"""`moepack convert hf:ORG/REPO[@REV] OUT --staging SIZE`: convert straight from the hub with
at most SIZE bytes of source shards on disk.

The staging folder `OUT.staging/` holds the small files (config, index, tokenizer: downloaded
whole) and, for every weight shard, either the real file (downloaded and SHA-256-checked by
moepack.fetch, recorded in its verified record) or a *stand-in*: the shard's safetensors header,
fetched by an HTTP range request, in a sparse file of the shard's size. With stand-ins the folder
is a complete checkpoint for planning (headers only), so the ordinary pipeline plans, journals
and finalizes; the executor (convert/stream_waves.py) runs the tasks in waves that fill at
most half the bound, the next wave's shards downloading while one runs. No task runs unless all
its shards are real. kill -9 at any point, then
the same command: journaled units are skipped, verified shards kept, an interrupted download of
the first wave resumed (a cut prefetch is dropped: it would exceed the bound); the container is
byte-identical to a local conversion (the manifest's source hashes are the hub's SHA-256,
which every download is checked against; a downloaded shard's header must equal its
stand-in's).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from moepack.convert.errors import ConvertError, SourceError
from moepack.convert.pipeline import SPACE_MARGIN, Summary, convert, refuse_directory
from moepack.convert.progress import Reporter
from moepack.convert.settings import Settings
from moepack.convert.source import BLOB_FILES, INDEX_NAME, SINGLE_NAME, Checkpoint, index_shards
from moepack.convert.st_header import MAX_HEADER
from moepack.convert.stream_waves import (
    ShardIndex,
    StreamExecutor,
    StreamStats,
    read_prefix,
    write_standin,
)

SMALL_FILES = ("config.json", INDEX_NAME, *BLOB_FILES)


def staging_dir(out: Path) -> Path:
    return out.with_name(out.name + ".staging")


@dataclass
class _Hub:
    """The repository pinned to one commit, and fetch's download machinery pointed at it."""

    repo: str
    revision: str
    files: dict[str, object]           # name -> fetch RemoteFile
    stage: Path
    record: object = field(init=False)  # fetch VerifiedRecord of the staging folder

    def __post_init__(self) -> None:
        from moepack.fetch.hub_state import VerifiedRecord

        self.record = VerifiedRecord(self.stage)

    def url(self, name: str) -> str:
        from moepack.fetch.hub_download import resolve_url

        return resolve_url(self.repo, self.revision, name)

    def verified_sha(self, name: str) -> str | None:
        """The SHA-256 recorded when `name` was checked as the listed content, if unchanged since
        (a plain file checked at another revision is not)."""
        return self.record.verified(self.files[name])  # type: ignore[attr-defined]

    def verified(self, name: str) -> bool:
        return self.verified_sha(name) is not None

    def download(self, name: str) -> int:
        """Download `name` into the staging folder (resuming NAME.incomplete); bytes fetched."""
        from moepack.fetch.errors import FetchError
        from moepack.fetch.hub_download import DownloadPolicy, download

        f = self.files[name]
        try:
            sha = download(f, self.url(name), self.stage, DownloadPolicy())  # type: ignore[arg-type]
        except (FetchError, OSError) as e:
            raise ConvertError(f"{name}: download failed: {e}; rerun the same command to "
                               "continue") from None
        self.record.checked(f, sha)  # type: ignore[attr-defined]
        return int(f.size)  # type: ignore[attr-defined]

    def header(self, name: str) -> bytes:
        """The first 8 + header-length bytes of a shard, by HTTP range requests (bounded)."""
        size = int(self.files[name].size)  # type: ignore[attr-defined]
        head = self._range(name, 0, 8)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise SourceError(f"{name}: corrupt safetensors header: header length {n} does not "
                              f"fit in the {size}-byte file")
        return head + self._range(name, 8, 8 + n)

    def _range(self, name: str, start: int, end: int) -> bytes:
        import httpx2
        from huggingface_hub.utils import build_hf_headers, get_session

        headers = build_hf_headers(token=os.environ.get("HF_TOKEN") or None)
        headers.update({"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"})
        body = bytearray()
        try:
            with get_session().stream("GET", self.url(name), headers=headers,
                                      timeout=httpx2.Timeout(30.0, read=120.0)) as r:
                if r.status_code not in (200, 206):
                    raise ConvertError(f"{name}: HTTP {r.status_code} asking for its header")
                for chunk in r.iter_bytes():  # a 200 (Range ignored) is cut at `end`
                    body += chunk
                    if len(body) >= end - start if r.status_code == 206 else len(body) >= end:
                        break
        except httpx2.HTTPError as e:
            raise ConvertError(f"{name}: cannot read its header: {e}") from None
        data = bytes(body) if r.status_code == 206 else bytes(body[start:end])
        if len(data) < end - start:
            raise ConvertError(f"{name}: short answer reading its header ({len(data)} of "
                               f"{end - start} bytes)")
        return data[:end - start]


def _weight_files(source: str, stage: Path, listed: Mapping[str, object]) -> list[str]:
    """The weight shards: those the downloaded index names (each one a listed file other than
    the small files), else model.safetensors."""
    if INDEX_NAME not in listed:
        if SINGLE_NAME not in listed:
            raise ConvertError(f"{source}: no {SINGLE_NAME} and no {INDEX_NAME} in the "
                               "repository, so no weights to convert")
        return [SINGLE_NAME]
    _, names = index_shards(stage / INDEX_NAME)
    for name in names:
        if name in SMALL_FILES:   # its stand-in would replace the small file
            raise ConvertError(f"{INDEX_NAME}: weight_map names {name}, which is not a weight "
                               "shard")
        if name not in listed:
            raise ConvertError(f"{source}: {name} is listed in {INDEX_NAME} but not in the "
                               "repository")
    return names


def convert_from_hub(source: str, out: str | Path, settings: Settings, *, staging: int,
                     jobs: int | None = 1, force: bool = False, restart: bool = False,
                     dry_run: bool = False, reporter: Reporter | None = None,
                     pause_per_unit: float = 0.0,
                     ray: str | None = None) -> tuple[Summary | None, dict]:
    """Convert hub repository `source` (hf:ORG/REPO[@REV]) into `out` with at most `staging`
    bytes of weight shards on disk. Returns the pipeline's summary (None for a dry run) and the
    streaming facts (bytes downloaded, peak staged, planned peak disk).
    ray: run on this Ray cluster, tasks reading checked byte ranges from the hub and no shard
    stored anywhere (convert/cluster_hub.py); `staging` is then unused."""
    from moepack.fetch.errors import FetchError
    from moepack.fetch.hub_listing import list_repo, parse_hf_source

    rep = reporter or Reporter()
    out = Path(out)
    try:
        repo, rev = parse_hf_source(source)
        listing = list_repo(repo, rev, [])
    except FetchError as e:
        raise ConvertError(str(e)) from None
    stage = staging_dir(out)
    files = {f.name: f for f in listing.files}
    if "config.json" not in files:
        raise ConvertError(f"{source}: no config.json in the repository")
    refuse_directory(out)
    if os.path.lexists(out) and not force and not dry_run:
        raise ConvertError(f"{out} already exists; pass --force to replace it")
    if not out.parent.is_dir():  # a file there is not "missing": say what it is
        raise ConvertError(f"{out.parent}: " + ("not a directory" if os.path.lexists(out.parent)
                                               else "no such directory"))
    from moepack.safefs import ensure_dir

    created = not os.path.lexists(stage)
    ensure_dir(stage)
    hub = _Hub(repo, listing.revision, files, stage)
    try:
        weights, sizes, facts, known = _plan(hub, source, out, settings, staging, jobs, dry_run,
                                             ray is not None)
    except BaseException:
        if created:   # refused before any shard was downloaded: nothing left behind
            _remove_staging(stage, files)
        raise
    if dry_run:
        return None, facts
    stats = StreamStats(staging, facts["source_bytes"])
    if ray is not None:
        execute = _ray_execute(ray, hub, weights, sizes, known, stage, rep, stats)
    else:
        execute = StreamExecutor(hub, sizes, staging, jobs or 1, rep, stats).execute
    # With --ray the cluster's CPUs work: no local --jobs choice to announce.
    summary = convert(stage, out, settings, jobs=1 if ray else jobs, force=force,
                      restart=restart, reporter=rep, pause_per_unit=pause_per_unit,
                      known_files=known, execute=execute)
    summary.plan["ray"] = ray
    facts.update(downloaded=stats.downloaded, shards_downloaded=stats.shards_downloaded,
                 peak_staged=stats.peak_staged, waves=stats.waves, prefetched=stats.prefetched,
                 fetched_by_node=stats.fetched_by_node)
    _remove_staging(stage, files)
    return summary, facts


def _plan(hub: _Hub, source: str, out: Path, settings: Settings, staging: int,
          jobs: int | None, dry_run: bool,
          ray: bool) -> tuple[list[str], dict[str, int], dict, dict[str, tuple[int, int, str]]]:
    """The small files downloaded, a stand-in for every shard not yet real, the container
    planned from them: (shards, their sizes, the streaming facts, the shards' known hashes;
    none for a dry run). Every refusal of the repository or of the disk comes from here."""
    files, stage = hub.files, hub.stage
    for name in SMALL_FILES:  # whole, checked (kept until the end: a few MB)
        if name in files and not hub.verified(name):
            hub.download(name)
    weights = _weight_files(source, stage, files)
    sizes = {w: int(files[w].size) for w in weights}  # type: ignore[attr-defined]
    largest = max(sizes.values())
    small = sum(int(files[n].size) for n in SMALL_FILES if n in files)  # type: ignore[attr-defined]
    facts = {"repo": hub.repo, "revision": hub.revision, "staging_dir": str(stage),
             "staging_bound": staging, "source_bytes": sum(sizes.values()),
             "largest_shard": largest, "small_files": small}
    if ray:
        staging = facts["staging_bound"] = 0   # nothing staged: tasks read ranges
    elif staging < largest:
        raise ConvertError(f"--staging {staging:,} bytes is smaller than the largest shard "
                           f"({largest:,} bytes); give at least that, better a few shards")
    for name in weights:  # stand-ins: headers by range request, no shard data
        if not hub.verified(name) and not _valid_standin(stage / name, sizes[name]):
            write_standin(stage, name, hub.header(name), sizes[name])
    # Planning (headers only) through the pipeline's dry run: the exact container size.
    plan = convert(stage, out, settings, jobs=jobs, force=True, dry_run=True, plan_only=True).plan
    real = sum(sizes[n] for n in weights if hub.verified(n))
    facts["container_bytes"] = plan["file_size"]
    facts["peak_disk"] = plan["file_size"] + staging + small
    facts["free_space"] = shutil.disk_usage(out.parent).free
    if dry_run:
        return weights, sizes, facts, {}
    partial_exists = out.with_name(out.name + ".partial").exists()
    need = (0 if partial_exists else plan["file_size"]) + SPACE_MARGIN + staging - real
    if facts["free_space"] < need:
        raise ConvertError(f"not enough free space on {out.parent}: the container and "
                           f"--staging need {need:,} more bytes, {facts['free_space']:,} free")
    known = {}
    for name in weights:  # the hub's SHA-256 (every download is checked against it)
        st = (stage / name).stat()
        sha = files[name].sha256 or hub.verified_sha(name)  # type: ignore[attr-defined]
        if sha is None:
            raise ConvertError(f"{name}: the hub gives no SHA-256 for it (not an LFS file)")
        known[name] = (st.st_size, st.st_mtime_ns, sha)
    return weights, sizes, facts, known


def _ray_execute(address: str, hub: _Hub, weights: list[str], sizes: dict[str, int],
                 known: Mapping[str, tuple[int, int, str]], stage: Path, rep: Reporter,
                 stats: StreamStats) -> Callable[..., None]:
    from moepack.convert.cluster_hub import HubRayPlan, bulk_of, execute_on_ray, source_key

    headers = {n: read_prefix(stage / n) for n in weights}
    small = [n for n in ("config.json", INDEX_NAME) if (stage / n).is_file()]
    bulk = bulk_of(stage, small, headers, sizes)
    files = ShardIndex(Checkpoint(stage))

    def on_bytes(n: int) -> None:
        stats.downloaded += n
        rep.transfer(stats.downloaded, 0)   # streamed, never staged

    plan = HubRayPlan(address, source_key(hub.repo, hub.revision, bulk),
                      {n: hub.url(n) for n in weights}, dict(sizes),
                      {n: known[n][2] for n in weights}, headers, bulk, stage, files.of)
    return execute_on_ray(plan, on_bytes, rep.message, stats.fetched_by_node)


def _valid_standin(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size and len(read_prefix(path)) > 8
    except (OSError, struct.error):
        return False


def _remove_staging(stage: Path, files: Mapping[str, object]) -> None:
    """Remove what this module put in the staging folder (listed names, fetch's state), then
    the folder if it is empty; anything else a user put there stays."""
    from moepack.fetch.staging import STAGING_DIR

    for name in files:
        for p in (stage / name, stage / f"{name}.incomplete", stage / f".{name}.standin",
                  stage / f".{name}.blocks"):
            if p.is_file() and not p.is_symlink():
                p.unlink()
    shutil.rmtree(stage / STAGING_DIR, ignore_errors=True)
    try:
        stage.rmdir()
    except OSError:
        pass
