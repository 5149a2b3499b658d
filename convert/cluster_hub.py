"""`moepack convert hf:ORG/REPO OUT --ray ADDRESS`: Ray tasks read their source bytes straight
from the hub, checked, and no node holds shards on disk.

The hub's SHA-256 covers a whole file, so a range cannot be checked alone. The driver streams
each shard once, in the order the tasks use them, without writing it (convert/hub_ranges.py):
the SHA-256 must be the hub's and the header the one planning used, and the BLAKE3 digest of
every block is kept (`OUT.staging/.NAME.blocks`, so a rerun does not stream it again). A task is
submitted once all of its shards are verified; it fetches its tensors' byte ranges rounded out
to whole blocks and checks each block, so each node fetches only what its tasks read. The
source crosses the network twice (the driver's pass, the tasks' ranges), never the disk.

Workers rebuild the checkpoint's header view once per node: the config, the index and each
shard's safetensors header in sparse stand-in files in a private temp folder (a few MB), named
after the source and this run, and removed from every live node when the run ends (or fails).
A private repository's token goes to the tasks as an argument (hub_ranges.HubToken), not
through the nodes' environment; the shard URLs are the driver's, so HF_ENDPOINT is its too.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moepack.convert.errors import ConvertError, SourceError
from moepack.convert.hub_ranges import (
    BlockTable,
    HubToken,
    driver_token,
    fetch_range,
    stream_digests,
)
from moepack.convert.source import Checkpoint
from moepack.convert.st_header import TensorInfo
from moepack.convert.tasks import Task

from moepack.safefs import remove_created

OnMessage = Callable[[tuple], None]
CLEANUP_SECONDS = 15.0      # at most this long waiting for the nodes to remove header folders
KEPT_BLOCKS = 8             # verified end blocks a worker keeps: neighbouring tensors share them


# -- the worker side ------------------------------------------------------------------------
@dataclass(frozen=True)
class HubSource:
    """What every task needs to read the repository: `bulk` (an object ref) holds the small
    files and the shard headers; shards' URLs are the driver's (pinned to the commit)."""

    key: str                                # repo@commit and a digest of the bulk
    urls: tuple[tuple[str, str], ...]       # shard -> resolve URL
    bulk: Any                               # ray ObjectRef of {name: (bytes, size)}
    run: str                                # this run's id: its header folders' suffix
    token: HubToken | None = None           # the driver's hub token (repr hidden)


@dataclass(frozen=True)
class HubView:
    """A task's source: the repository and the block tables of the shards the task reads."""

    hub: HubSource
    tables: tuple[tuple[str, Any], ...]     # shard -> ray ObjectRef of its BlockTable

    def open(self) -> Checkpoint:
        import ray

        hub = self.hub
        ck = _OPENED.get((hub.key, hub.run))
        if ck is None:
            folder = _header_folder(header_folder_path(hub.key, hub.run), ray.get(hub.bulk))
            ck = _OPENED[hub.key, hub.run] = RangeCheckpoint(folder, dict(hub.urls), hub.token)
        for name, ref in self.tables:
            if name not in ck.tables:
                ck.tables[name] = ray.get(ref)
        return ck


class RangeCheckpoint(Checkpoint):
    """A checkpoint whose headers are local stand-ins and whose tensor bytes are read from the
    hub by range requests, each block checked against its shard's verified digests."""

    def __init__(self, folder: Path, urls: dict[str, str], token: HubToken | None) -> None:
        super().__init__(folder)
        self.urls, self.token = urls, token
        self.tables: dict[str, BlockTable] = {}
        self.fetched = 0     # bytes fetched since the last take_fetched
        # The first and last blocks of recent reads (LRU): a read rounded out to whole blocks
        # ends inside a block the next tensor in the file (or a small tensor such as an fp8
        # scale grid, stored side by side) starts in.
        self.kept: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def take_fetched(self) -> int:
        n, self.fetched = self.fetched, 0
        return n

    def _read_at(self, info: TensorInfo, name: str, start: int, length: int) -> bytes:
        table = self.tables.get(info.file)
        if table is None:
            raise ConvertError(f"{info.file}: read before the driver verified it (internal)")
        lo, hi = table.span(start, start + length)
        if hi == lo:
            return b""
        f, b = info.file, table.block
        first, last = lo // b, (hi - 1) // b
        i, j = first, last          # blocks [i, j] are fetched, the rest were kept
        while i <= j and (f, i) in self.kept:
            i += 1
        while j >= i and (f, j) in self.kept:
            j -= 1
        middle = self._fetch(table, name, i * b, min(table.size, (j + 1) * b)) if i <= j else b""
        data = b"".join([*(self.kept[f, k] for k in range(first, i)), middle,
                         *(self.kept[f, k] for k in range(j + 1, last + 1))])
        for k in (first, last):
            self.kept[f, k] = data[(k - first) * b:(k - first + 1) * b]
            self.kept.move_to_end((f, k))
        while len(self.kept) > KEPT_BLOCKS:
            self.kept.popitem(last=False)
        return data[start - lo:start - lo + length]

    def _fetch(self, table: BlockTable, name: str, lo: int, hi: int) -> bytes:
        """Blocks [lo, hi) of the table's file from the hub, each checked."""
        for _ in range(2):  # one more fetch: a proxy may have mangled the first answer
            data = fetch_range(self.urls[table.name], table.name, lo, hi, self.token)
            self.fetched += len(data)
            if table.check(lo, data):
                return data
        raise SourceError(f"{table.name}: bytes {lo}-{hi} from the hub differ from the file "
                          f"whose SHA-256 was verified (reading tensor {name!r})")


_OPENED: dict[tuple[str, str], RangeCheckpoint] = {}


def header_folder_path(key: str, run: str) -> Path:
    """This node's stand-in folder for source `key` in run `run` (one per run: a run removes
    its own at the end and never another's)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"moepack-ray-{os.getuid()}-{digest}-{run}"


def _header_folder(final: Path, bulk: Mapping[str, tuple[bytes, int]]) -> Path:
    """The stand-in folder `final`, made once per node (atomic rename; concurrent workers of
    one node race harmlessly)."""
    if os.path.lexists(final):
        st = os.lstat(final)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise ConvertError(f"{final} on node {os.uname().nodename} is not a folder of this "
                               "user; refusing to read headers from it: remove it")
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".moepack-ray-", dir=final.parent))
    try:
        for name, (data, size) in bulk.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.truncate(size)   # sparse: the header alone, at the shard's size
        os.rename(tmp, final)
    except OSError as e:  # another worker of this node was first: check theirs
        remove_created(tmp, list(bulk))
        if not os.path.lexists(final):
            raise ConvertError(f"{final}: cannot create it: {e.strerror or e}") from None
        return _header_folder(final, bulk)
    return final


def remove_header_folder(key: str, run: str, names: list[str]) -> bool:
    """Remove this node's header folder of `run` (the files this run wrote, then the folder if
    nothing else is in it)."""
    return remove_created(header_folder_path(key, run), names)


def remove_header_folders(ray: Any, source: HubSource, names: list[str]) -> None:
    """Remove `source`'s header folders on every live node (a dead one has no temp dir left to
    clean). Bounded: a node that does not answer in CLEANUP_SECONDS keeps its folder."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(remove_header_folder)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"],
                                                                             soft=False))
            .remote(source.key, source.run, names)
            for n in ray.nodes() if n.get("Alive")]
    ray.wait(refs, num_returns=len(refs), timeout=CLEANUP_SECONDS)


# -- the driver side ------------------------------------------------------------------------
class ShardVerifier(threading.Thread):
    """Streams the shards in the order given (a saved table is reused), one at a time."""

    def __init__(self, order: list[str], verify: Callable[[str], BlockTable]) -> None:
        super().__init__(name="moepack-verify-shards", daemon=True)
        self.order, self.verify = order, verify
        self.tables: dict[str, BlockTable] = {}
        self.error: BaseException | None = None
        self.changed = threading.Condition()
        self.stopping = False

    def run(self) -> None:
        try:
            for name in self.order:
                if self.stopping:
                    return
                table = self.verify(name)
                with self.changed:
                    self.tables[name] = table
                    self.changed.notify_all()
        except BaseException as e:  # reported by the driver's loop
            with self.changed:
                self.error = e
                self.changed.notify_all()


class HubSources:
    """The driver's view provider for `cluster.Driver`: a task's HubView once its shards are
    verified, None before."""

    def __init__(self, ray: Any, source: HubSource, need: Callable[[Task], frozenset],
                 verifier: ShardVerifier) -> None:
        self.ray, self.source, self.need, self.verifier = ray, source, need, verifier
        self.refs: dict[str, Any] = {}

    def view(self, task: Task) -> HubView | None:
        self.raise_error()
        names = sorted(self.need(task))
        if any(n not in self.verifier.tables for n in names):
            return None
        for n in names:
            if n not in self.refs:
                self.refs[n] = self.ray.put(self.verifier.tables[n])
        return HubView(self.source, tuple((n, self.refs[n]) for n in names))

    def wait(self, seconds: float) -> None:
        with self.verifier.changed:
            self.verifier.changed.wait(seconds)
        self.raise_error()

    def raise_error(self) -> None:
        e = self.verifier.error
        if isinstance(e, ConvertError):
            raise type(e)(str(e)) from None
        if e is not None:
            raise ConvertError(f"verifying shards: {type(e).__name__}: {e}") from None

    def close(self) -> None:
        self.verifier.stopping = True


def blocks_path(stage: Path, name: str) -> Path:
    return stage / f".{name}.blocks"


def bulk_of(stage: Path, small: list[str], headers: Mapping[str, bytes],
            sizes: Mapping[str, int]) -> dict[str, tuple[bytes, int]]:
    """The files a worker's header folder holds: small files whole, shard stand-ins."""
    out = {n: ((stage / n).read_bytes(), (stage / n).stat().st_size) for n in small}
    out.update({n: (headers[n], sizes[n]) for n in headers})
    return out


def source_key(repo: str, revision: str, bulk: Mapping[str, tuple[bytes, int]]) -> str:
    h = hashlib.sha256()
    for name in sorted(bulk):
        data, size = bulk[name]
        h.update(f"{name}\0{size}\0{len(data)}\0".encode() + data)
    return f"{repo}@{revision}:{h.hexdigest()[:16]}"


def verify_shard(stage: Path, name: str, url: str, size: int, sha256: str, header: bytes,
                 on_bytes: Callable[[int], None]) -> BlockTable:
    """The shard's block table: saved by an earlier run for this SHA-256, or streamed now."""
    path = blocks_path(stage, name)
    table = BlockTable.load(path, name, size, sha256)
    if table is None:
        table = stream_digests(url, name, size, sha256, header, on_bytes)
        table.save(path, sha256)
    return table


@dataclass
class HubRayPlan:
    """What the driver knows of the repository after planning (convert/stream.py)."""

    address: str                                # --ray
    key: str
    urls: dict[str, str]                        # shard -> resolve URL
    sizes: dict[str, int]
    sha256: dict[str, str]
    headers: dict[str, bytes]                   # shard -> its stand-in's header bytes
    bulk: dict[str, tuple[bytes, int]]
    stage: Path
    files_of: Callable[[list[str]], frozenset]  # tensor names -> the shards holding them


def task_tensors(task: Task) -> list[str]:
    return [j.ref.name for j in task.trunk] + [r.name for _, refs in task.experts
                                               for r in refs.values()]


def execute_on_ray(plan: HubRayPlan, on_bytes: Callable[[int], None],
                   message: Callable[[str], None],
                   by_node: dict[str, int]) -> Callable[..., None]:
    """The pipeline's `execute`: connect, verify shards in the order the tasks use them, and
    run the tasks on the cluster as they become readable. `by_node` gets the source bytes each
    node's tasks fetched by range requests."""
    def execute(cfg: Any, tasks: list[Task], done: dict[str, str],
                report: OnMessage) -> None:
        def on_message(msg: tuple) -> None:
            if msg[0] == "fetched":
                by_node[msg[1]] = by_node.get(msg[1], 0) + msg[2]
            else:
                report(msg)

        from moepack.convert.cluster import CONNECT_SECONDS, connect, import_ray, run_on_ray

        if not tasks:
            return
        order: list[str] = []
        for t in tasks:
            order += [n for n in sorted(plan.files_of(task_tensors(t))) if n not in order]

        def verify(name: str) -> BlockTable:
            message(f"verifying {name} ({plan.sizes[name]:,} bytes, streamed, not stored)")
            return verify_shard(plan.stage, name, plan.urls[name], plan.sizes[name],
                                plan.sha256[name], plan.headers[name], on_bytes)

        with connect(plan.address) as cluster:
            message(cluster.describe())
            ray = import_ray()
            source = HubSource(plan.key, tuple(sorted(plan.urls.items())), ray.put(plan.bulk),
                               secrets.token_hex(8), driver_token())
            verifier = ShardVerifier(order, verify)
            sources = HubSources(ray, source, lambda t: plan.files_of(task_tensors(t)), verifier)
            verifier.start()
            try:
                run_on_ray(cfg, tasks, done, cluster, on_message, sources)
            finally:  # after run_on_ray stopped its tasks: none can make a folder again
                # Without a head no task can be placed: the nodes keep their folders.
                if cluster.head_silence(CONNECT_SECONDS) is None:
                    remove_header_folders(ray, source, list(plan.bulk))
    return execute
