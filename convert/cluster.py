"""`moepack convert --ray ADDRESS`: conversion units as Ray tasks across a cluster.

The driver (this process) plans, keeps the journal and is the only writer of `OUT.partial`. Ray
tasks compute units with the same functions local workers use (convert/encoding.py): one task
per trunk tensor, one per (MoE layer, projection) codebook, one per chunk of a layer's experts
(their codebooks are task arguments, so experts wait for their layer's training and nothing
else). Every task reads its source byte ranges itself from SRC, which must be the same path on
every node (a shared filesystem); it returns the encoded bytes and their BLAKE3 digests, which
the driver checks while it pwrites them at their planned offsets. A batch of units is journaled
only after the partial file is fsynced, as with local workers, so the output is byte-identical to
`--jobs 1` and a dead driver resumes from the journal. A task whose worker process or node dies
is run again by Ray (`MAX_RETRIES`); its units are deterministic, so the bytes are the same.
"""

from __future__ import annotations

import _thread
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import blake3
from moepack.convert.adapters import EXPERT_PARTS
from moepack.convert.encoding import (
    Codebook,
    encode_expert,
    encode_trunk,
    stored_codebook,
    train_codebook,
)
from moepack.convert.errors import ConvertError, SourceError
from moepack.convert.quant import RvqSettings
from moepack.convert.source import Checkpoint, SourceRef
from moepack.convert.tasks import Task, expert_unit, tensor_unit
from moepack.convert.worker import WorkerConfig, peak_rss, read_codebook, spec_of
from moepack.format import BankLayout, ContainerWriter

INSTALL = "pip install 'moepack[cluster]'"
MAX_RETRIES = 3                 # runs of a task after its worker process or node died
CHUNK_BYTES = 256 << 20         # expert records returned by one task, at most (>= 1 expert)
CHUNK_EXPERTS = 16
IN_FLIGHT_PER_CPU = 3           # tasks submitted ahead of results, per cluster CPU
STOP_SECONDS = 10.0             # after a failure, wait at most this for cancelled tasks
CONNECT_SECONDS = 10.0          # a TCP connect to the head, before ray.init retries for minutes
HEAD_CHECK_SECONDS = 2.0        # while connected: how often the driver checks the head answers
RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
RECONNECT_DEFAULT = 60.0        # Ray's: a driver whose head is gone this long exits, no word


def experts_per_task(stride: int) -> int:
    """Experts one expert task encodes: at most CHUNK_EXPERTS and CHUNK_BYTES of records."""
    return max(1, min(CHUNK_EXPERTS, CHUNK_BYTES // max(1, stride)))


OnMessage = Callable[[tuple], None]
_MISMATCH = ("the bytes received differ from the bytes the worker encoded (digest mismatch); "
             "rerun the same command to continue")


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ConvertError(f"--ray needs Ray, which is not installed here: {INSTALL} "
                           "(or pip install 'ray>=2.40')") from None
    return ray


@dataclass(frozen=True)
class Cluster:
    address: str            # what the driver connected to
    nodes: int
    cpus: int
    started_here: bool      # `auto` found no cluster and started a local one
    watch: HeadWatch | None = field(default=None, compare=False)  # its GCS address too

    def describe(self) -> str:
        how = "local cluster started for this run" if self.started_here else self.address
        return f"ray: {self.nodes} node(s), {self.cpus} CPUs ({how})"

    def head_silence(self, seconds: float) -> str | None:
        """Why the head's GCS does not answer a TCP connect (None: it does, or is unknown)."""
        target = host_port(self.watch.gcs) if self.watch else None
        return None if target is None else silence(*target, seconds)


@contextmanager
def connect(address: str) -> Iterator[Cluster]:
    """Attach to the cluster at `address` (`auto`: the local one, started if there is none);
    disconnects at the end (and stops a cluster started here)."""
    ray = import_ray()
    # Ray prints raylet notices (e.g. "A worker died ...") on stdout, where `--json` writes its
    # summary: they go to stderr while connected.
    with redirect_stdout(sys.stderr):
        started = _init(ray, address)
        # Watched from here on: the head may die while the driver hashes or plans, not only
        # while tasks run, and Ray would then end the process with a line of its own.
        watch = HeadWatch(address, _gcs_address(ray))
        try:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if cpus < 1:
                raise ConvertError(f"--ray {address}: the cluster has no CPUs to run tasks on")
            yield Cluster(address, len(alive), cpus, started, watch)
        except KeyboardInterrupt:
            if watch.error is None:  # a real Ctrl-C
                raise
            raise watch.error from None
        finally:
            watch.stop()
            ray.shutdown()


def _init(ray: ModuleType, address: str) -> bool:
    """ray.init; True if `auto` found no cluster and started a local one."""
    opts: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    _refuse_silent_head(address)
    try:
        if address != "auto":
            ray.init(address=address, **opts)
            return False
        try:
            ray.init(address="auto", **opts)
            return False
        except ConnectionError:
            ray.init(include_dashboard=False, **opts)
            return True
    except Exception as e:  # ConnectionError, ValueError, RuntimeError, TimeoutError
        raise ConvertError(f"--ray {address}: cannot connect: {one_line(e)}") from None


def _gcs_address(ray: ModuleType) -> str:
    """host:port of the head's GCS ("" where Ray does not say, e.g. a ray:// client)."""
    try:
        return str(ray.get_runtime_context().gcs_address or "")
    except Exception:  # noqa: BLE001 (then the head is not watched, nothing else changes)
        return ""


def one_line(e: BaseException) -> str:
    """Ray's messages span lines (version mismatch, out of memory): the error is one line."""
    return " ".join(str(e).split()) or type(e).__name__


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `[ray://]host:port`; None for anything else (Ray judges it)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def silence(host: str, port: int, seconds: float) -> str | None:
    """None if something accepts a TCP connection at host:port within `seconds`, else why not."""
    try:
        socket.create_connection((host, port), timeout=seconds).close()
    except socket.gaierror as e:
        return f"cannot resolve {host}: {e.strerror}"
    except TimeoutError:
        return f"no answer within {seconds:g} s"
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def _refuse_silent_head(address: str) -> None:
    """ray.init retries an address where nothing listens for about 13 minutes (20 tries of
    40 s): a plain TCP connect says so in seconds."""
    given = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    target = host_port(given)
    if target is None:
        return
    why = silence(*target, CONNECT_SECONDS)
    if why is not None:
        raise ConvertError(f"--ray {address}: cannot connect: nothing answers at {given} ({why}); "
                           "is the cluster's head running there (ray start --head) and is this "
                           "its address (host:port, port 6379 unless --port said otherwise)?")


def reconnect_seconds() -> float:
    try:
        return float(os.environ.get(RECONNECT_ENV, RECONNECT_DEFAULT))
    except ValueError:
        return RECONNECT_DEFAULT


class HeadWatch:
    """Notices a head (its GCS) gone: Ray ends a driver that lost it after RECONNECT_ENV seconds
    with a line of its own, so the driver gives up first, after a third of that, in one line.
    A thread checks every HEAD_CHECK_SECONDS while connected and then interrupts the main
    thread (as Ctrl-C would, which every phase already stops cleanly for; `connect` turns it
    into `error`); a driver outside the main thread sees `error` at its next `check`."""

    def __init__(self, address: str, gcs: str) -> None:
        self.address, self.gcs = address, gcs
        self.grace = reconnect_seconds() / 3
        self.lost_since: float | None = None
        self.error: ConvertError | None = None
        self._main = threading.current_thread() is threading.main_thread()
        self._stopped = threading.Event()
        self._lock = threading.Lock()   # no interrupt once stop() returned
        if host_port(gcs) is not None:  # else not watched (e.g. a ray:// client)
            threading.Thread(target=self._watch, name="moepack-head-watch", daemon=True).start()

    def _watch(self) -> None:
        target = host_port(self.gcs)
        assert target is not None
        while not self._stopped.wait(HEAD_CHECK_SECONDS):
            why = silence(*target, HEAD_CHECK_SECONDS)
            now = time.monotonic()
            if why is None:
                self.lost_since = None
                continue
            if self.lost_since is None:
                self.lost_since = now
            if now - self.lost_since < self.grace:
                continue
            with self._lock:
                if self._stopped.is_set():
                    return
                self.error = ConvertError(
                    f"--ray {self.address}: the cluster's head stopped answering ({self.gcs}: "
                    f"{why}, for {now - self.lost_since:.0f} s); the work done so far is kept: "
                    "rerun the same command once the cluster is back to continue")
                if self._main:
                    _thread.interrupt_main()
            return

    def check(self) -> None:
        """Raise the error where no interrupt carries it (a driver outside the main thread)."""
        if self.error is not None and not self._main:
            raise self.error

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()

    @property
    def lost(self) -> bool:
        return self.lost_since is not None


# -- what runs on the cluster ---------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """The source as the driver fingerprinted it: a worker refuses a copy whose sizes differ."""

    path: str
    sizes: tuple[tuple[str, int], ...]

    def open(self) -> Checkpoint:
        ck = _CHECKPOINTS.get(self)
        if ck is None:
            ck, sizes = self._read()
            for name, size in self.sizes:
                have = sizes[name]
                if have != size:
                    raise SourceError(f"{self.path}/{name} on node {_node()}: {have:,} bytes, "
                                      f"the driver's has {size:,}; SRC must be the same on "
                                      "every node")
            _CHECKPOINTS[self] = ck
        return ck


    def _read(self) -> tuple[Checkpoint, dict[str, int]]:
        """The checkpoint on this node and its files' sizes: a node that cannot see SRC says
        so, not just what is missing."""
        try:
            ck = Checkpoint(self.path)
            return ck, {name: (ck.dir / name).stat().st_size for name, _ in self.sizes}
        except (ConvertError, OSError) as e:
            raise SourceError(f"{self.path} on node {_node()}: cannot read it there ({one_line(e)})"
                              "; SRC must be the same path on every node of the cluster (a "
                              "shared filesystem), or pass hf:ORG/REPO so nodes read the hub"
                              ) from None


_CHECKPOINTS: dict[Source, Checkpoint] = {}


class TaskSource(Protocol):
    """What a task reads: `Source` (a shared path) or cluster_hub.HubView (the hub)."""

    def open(self) -> Checkpoint: ...


class SharedPath:
    """Sources of a shared-path conversion: every task reads the same `Source`, at once."""

    def __init__(self, src: Source) -> None:
        self.src = src

    def view(self, task: Task) -> TaskSource | None:
        return self.src

    def wait(self, seconds: float) -> None: ...
    def close(self) -> None: ...


class Sources(Protocol):
    """A task's source once it can run (None: not yet, e.g. its shards are being verified)."""

    def view(self, task: Task) -> TaskSource | None: ...
    def wait(self, seconds: float) -> None: ...
    def close(self) -> None: ...


def _node() -> str:
    return os.uname().nodename


def _whoami(ck: Checkpoint) -> tuple[str, int, int]:
    """(Ray node id, peak RSS of this worker process, source bytes this task fetched over the
    network: hub sources only)."""
    import ray

    take = getattr(ck, "take_fetched", None)
    return ray.get_runtime_context().get_node_id(), peak_rss(), take() if take else 0


def _digest(data: bytes | bytearray) -> str:
    return blake3.blake3(data).hexdigest()


def trunk_task(src: TaskSource, name: str, codec: dict, ref: SourceRef) -> tuple:
    ck = src.open()
    data = bytes(encode_trunk(ck, codec, ref, threads=1))
    return ("tensor", name, data, None, _digest(data), _whoami(ck))


def codebook_task(src: TaskSource, bank: BankLayout, part: str, experts: dict[int, dict],
                  rvq: RvqSettings, seed: int, cb_codec: dict, rotated: bool) -> tuple:
    ck = src.open()
    book = train_codebook(ck, bank, part, experts, rvq, seed, cb_codec, rotated, threads=1)
    return ("codebook", part, book.data, book.rotation, _digest(book.data), _whoami(ck))


@dataclass(frozen=True)
class BookSpec:
    """How an expert task turns a codebook's stored bytes back into the values to encode with."""

    codec: dict
    shape: tuple[int, ...]
    stages: int
    cols: int


def experts_task(src: TaskSource, bank: BankLayout, todo: list[tuple[int, dict[str, SourceRef]]],
                 rvq: RvqSettings, specs: dict[str, BookSpec], pause: float,
                 *books: tuple) -> tuple:
    """Records of `todo` experts; `books` are codebook_task results (or stored bytes) in
    EXPERT_PARTS order."""
    ck = src.open()
    values: dict[str, Codebook] = {}
    for part, book in zip(EXPERT_PARTS, books, strict=True):
        s = specs[part]
        values[part] = stored_codebook(s.codec, s.shape, s.stages, book[2], book[3], s.cols)
    out = []
    for e, refs in todo:
        record = encode_expert(ck, bank, refs, values, rvq, threads=1)
        h = blake3.blake3(record)
        h.update(bytes(bank.stride - len(record)))  # as stored: the record and its padding
        out.append((e, record, h.hexdigest()))
        if pause:
            time.sleep(pause)
    return ("experts", bank.layer, out, None, None, _whoami(ck))


# -- the driver -----------------------------------------------------------------------------
@dataclass
class _Pending:
    task: Task
    left: int                    # Ray tasks of this conversion task still running
    rss: int = 0


class Driver:
    """Submits a conversion's units as Ray tasks (bounded in flight) and writes their results."""

    def __init__(self, ray: ModuleType, cfg: WorkerConfig, cluster: Cluster,
                 on_message: OnMessage, sources: Sources | None = None) -> None:
        self.ray, self.cfg, self.on_message = ray, cfg, on_message
        if sources is None:
            ck = Checkpoint(cfg.src)
            sources = SharedPath(Source(str(Path(cfg.src).resolve()),
                                        tuple((f, (ck.dir / f).stat().st_size)
                                              for f in ck.files)))
        self.sources = sources
        self.writer = ContainerWriter(cfg.out, cfg.layout, create=False,
                                      overwrite=cfg.overwrite)
        self.fd = os.open(self.writer.partial, os.O_RDONLY)
        self.limit = max(4, IN_FLIGHT_PER_CPU * cluster.cpus)
        # SPREAD: every node works even when tasks are short (the default packs the driver's
        # node first); the source is read from a shared path, so locality does not matter.
        opts = {"num_cpus": 1, "max_retries": MAX_RETRIES, "retry_exceptions": False,
                "scheduling_strategy": "SPREAD"}
        self.remote = {f.__name__: ray.remote(**opts)(f)
                       for f in (trunk_task, codebook_task, experts_task)}
        self.inflight: dict[Any, _Pending] = {}
        self.head = cluster.watch

    def close(self) -> None:
        self.sources.close()
        # Without a head, cancelling waits for nothing that can come.
        if not (self.head and self.head.lost):
            self._stop_inflight()
        self.writer.close()
        os.close(self.fd)

    def _stop_inflight(self) -> None:
        """After a failure: cancel the tasks still running and wait (bounded) until they
        ended, so none starts writing on a node after the run cleaned up."""
        refs = list(self.inflight)
        if not refs:
            return
        for ref in refs:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 (already finished or its node gone: nothing to stop)
                continue
        self.ray.wait(refs, num_returns=len(refs), timeout=STOP_SECONDS)

    def run(self, tasks: list[Task], done: Mapping[str, str]) -> None:
        waiting = deque(tasks)          # in order: a task's source may not be ready yet
        queue: deque[tuple[Callable[[], Any], _Pending]] = deque()
        while waiting or queue or self.inflight:
            if self.head:
                self.head.check()
            while waiting and (src := self.sources.view(waiting[0])) is not None:
                task = waiting.popleft()
                p = _Pending(task, 0)
                for submit in self._plan(task, done, src):
                    p.left += 1
                    queue.append((submit, p))
                if not p.left:  # nothing left to do in it
                    self.on_message(("task_done", task.key, 0))
            while queue and len(self.inflight) < self.limit:
                submit, p = queue.popleft()
                self.inflight[submit()] = p
            if not self.inflight:
                if waiting:
                    self.sources.wait(0.5)
                continue
            ready, _ = self.ray.wait(list(self.inflight), num_returns=1,
                                     timeout=0.5 if waiting else HEAD_CHECK_SECONDS)
            for ref in ready:
                self._collect(ref, self.inflight.pop(ref))

    def _plan(self, task: Task, done: Mapping[str, str],
              src: TaskSource) -> list[Callable[[], Any]]:
        """Closures that submit this task's missing units (codebooks before their experts)."""
        r, cfg = self.remote, self.cfg
        out: list[Callable[[], Any]] = []
        for job in task.trunk:
            if tensor_unit(job.name) not in done:
                out.append(lambda j=job: r["trunk_task"].remote(src, j.name, j.codec, j.ref))
        if task.layer is None:
            return out
        layer = task.layer
        todo = [(e, refs) for e, refs in task.experts if expert_unit(layer, e) not in done]
        if not todo:
            return out
        bank = cfg.layout.bank(layer)
        experts = dict(task.experts)
        books: list[Any] = []      # per part: an ObjectRef (training) or stored bytes
        specs: dict[str, BookSpec] = {}
        for i, part in enumerate(EXPERT_PARTS):
            cb_name, rot_name = cfg.codebook_names[layer][part]
            cb = spec_of(cfg.layout, cb_name)
            stages = bank.parts[i].codec["stages"]
            cols = 0 if rot_name is None else spec_of(cfg.layout, rot_name).shape[0]
            specs[part] = BookSpec(cb.codec, tuple(cb.shape), stages, cols)
            if tensor_unit(cb_name) in done and (rot_name is None
                                                 or tensor_unit(rot_name) in done):
                book = read_codebook(cfg.layout, self.fd, self.writer.partial,
                                     (cb_name, rot_name), stages, done)
                books.append(("codebook", part, book.data, book.rotation, None, ("", 0, 0)))
                continue
            books.append(None)  # the training task's ref, once submitted (before its experts)

            def train(i: int = i, part: str = part, codec: dict = cb.codec,
                      rotated: bool = rot_name is not None) -> Any:
                books[i] = r["codebook_task"].remote(src, bank, part, experts, cfg.rvq,
                                                     cfg.seed, codec, rotated)
                return books[i]
            out.append(train)
        per = experts_per_task(bank.stride)
        for lo in range(0, len(todo), per):
            chunk = todo[lo:lo + per]
            out.append(lambda c=chunk: r["experts_task"].remote(
                src, bank, c, cfg.rvq, specs, cfg.pause_per_unit, *books))
        return out

    def _collect(self, ref: Any, p: _Pending) -> None:
        try:
            kind, key, data, extra, digest, (node, rss, fetched) = self.ray.get(ref)
        except self.ray.exceptions.RayError as e:
            raise task_failure(self.ray, p.task.key, e) from None
        del ref  # the object store may drop the result once it is written
        units: list[tuple[str, str]] = []
        nbytes = experts = 0
        if kind == "tensor":
            units.append(self._write_tensor(key, data, digest))
            nbytes = len(data)
        elif kind == "codebook":
            assert p.task.layer is not None
            cb_name, rot_name = self.cfg.codebook_names[p.task.layer][key]
            units.append(self._write_tensor(cb_name, data, digest))
            nbytes = len(data)
            if rot_name is not None and extra is not None:
                units.append(self._write_tensor(rot_name, extra, _digest(extra)))
                nbytes += len(extra)
        else:
            bank = self.cfg.layout.bank(key)
            for e, record, want in data:
                got = self.writer.write_expert(key, e, record).hex()
                if got != want:
                    raise ConvertError(f"layer {key} expert {e}: {_MISMATCH}")
                units.append((expert_unit(key, e), got))
            nbytes, experts = len(data) * bank.stride, len(data)
        os.fsync(self.fd)  # durable before journaled
        self.on_message(("units", units, nbytes, experts))
        self.on_message(("node", node))
        if fetched:
            self.on_message(("fetched", node, fetched))
        p.rss = max(p.rss, rss)
        p.left -= 1
        if p.left == 0:
            self.on_message(("task_done", p.task.key, p.rss))

    def _write_tensor(self, name: str, data: bytes, digest: str) -> tuple[str, str]:
        got = self.writer.write_tensor(name, data).hex()
        if got != digest:
            raise ConvertError(f"{name}: {_MISMATCH}")
        return tensor_unit(name), got


def task_failure(ray: ModuleType, key: str, e: Exception) -> ConvertError:
    """The one-line error for a Ray task that failed: its own error, or Ray's (retries used
    up, node lost, out of memory, ...), whose messages span lines."""
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, ConvertError):
            return type(cause)(one_line(cause))
        if cause is not None:
            return ConvertError(f"{key}: {one_line(cause)}")
    return ConvertError(f"{key}: {type(e).__name__}: {one_line(e)}; rerun the same command to "
                        "continue")


def run_on_ray(cfg: WorkerConfig, tasks: list[Task], done: Mapping[str, str], cluster: Cluster,
               on_message: OnMessage, sources: Sources | None = None) -> None:
    """Run `tasks` on the connected cluster (inside `connect`), reporting like local workers;
    `sources`: where tasks read (default: SRC, the same path on every node)."""
    if not tasks:
        return
    driver = Driver(import_ray(), cfg, cluster, on_message, sources)
    try:
        driver.run(tasks, done)
    finally:
        driver.close()
