"""A real multi-node Ray cluster on this machine for tests: `ray start --head` and `ray start
--address` (one CPU each), every port chosen free, its own temp dir, stopped at the end by
killing exactly the process groups this helper started (never `ray stop`, which would also stop
anyone else's Ray on a shared machine).

Ray advertises the host's primary address rather than 127.0.0.1 (its `resolve_ip_for_localhost`
rewrites loopback), so the nodes talk over that address; nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalCluster:
    address: str
    temp_dir: Path
    groups: list[int] = field(default_factory=list)   # process groups of the nodes
    ports: set[int] = field(default_factory=set)      # every port given to a node
    dead: set[int] = field(default_factory=set)       # numbers of the nodes killed

    def processes(self, groups: list[int] | None = None) -> list[tuple[int, str]]:
        """(pid, command line) of every process in this cluster's process groups (or just
        `groups`: one node's) and of their descendants (Ray's worker processes run in sessions
        of their own)."""
        groups = self.groups if groups is None else groups
        table = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                    table[int(d.name)] = (int(stat[1]), int(stat[2]))  # ppid, pgid
                except (OSError, IndexError, ValueError):
                    continue
        ours = {pid for pid, (_, pgid) in table.items() if pgid in groups}
        grew = True
        while grew:
            more = {pid for pid, (ppid, _) in table.items() if ppid in ours} - ours
            ours |= more
            grew = bool(more)
        out = []
        for pid in sorted(ours):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            out.append((pid, cmd.decode(errors="replace").strip()))
        return out

    def task_workers(self, function: str, node: int | None = None) -> list[int]:
        """PIDs of worker processes running `function` now (Ray titles them ray::NAME), on
        node number `node` (0: the head, in start order) or on any."""
        groups = None if node is None else [self.groups[node]]
        return [pid for pid, cmd in self.processes(groups) if cmd.startswith(f"ray::{function}")]

    def add_node(self, cpus: int = 1) -> int:
        """Start one more node; returns its number."""
        _start(self, ["--address", self.address, *_common(cpus), *_node_ports(self.ports)])
        _wait_ready(self.address, len(self.groups) - len(self.dead))
        return len(self.groups) - 1

    def kill_node(self, node: int) -> list[int]:
        """SIGKILL every process of node number `node` at once (raylet, its agents, its
        workers): the machine died. Returns the PIDs killed."""
        pids = [pid for pid, _ in self.processes([self.groups[node]])]
        self.dead.add(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            workers = [pid for pid, _ in self.processes() if _pgid(pid) not in self.groups]
            for g in self.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(g, sig)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            end = time.monotonic() + wait
            while time.monotonic() < end and self._alive():
                time.sleep(0.1)
            if not self._alive():
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _alive(self) -> bool:
        return any(not _zombie(pid) for pid, _ in self.processes())


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _start(cluster: LocalCluster, args: list[str]) -> None:
    # A new session: `ray start` and the daemons it leaves behind share one process group.
    p = subprocess.Popen([RAY, "start", *args], start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    cluster.groups.append(p.pid)
    try:
        out, _ = p.communicate(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out[-4000:]}")


_READY = """
import sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="WARNING")
end = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) != int(sys.argv[2]):
    assert time.monotonic() < end, "nodes did not join"
    time.sleep(0.2)
f = ray.remote(num_cpus=1)(lambda: ray.get_runtime_context().get_node_id())
ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
assert sorted(ray.get([f.options(scheduling_strategy=On(i, soft=False)).remote() for i in ids])) \
    == sorted(ids)
"""


def _wait_ready(address: str, nodes: int) -> None:
    """Every node registered and able to start a worker and run a task."""
    r = subprocess.run([sys.executable, "-c", _READY, address, str(nodes)], capture_output=True,
                       text=True, timeout=START_TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"Ray cluster at {address} not ready:\n{r.stderr[-4000:]}")


def _node_ports(taken: set[int]) -> list[str]:
    """Free ports for one node's components and a 41-port worker range, none of them in
    `taken` (the cluster's other ports) nor in each other's way (Ray refuses overlaps)."""
    lo = free_port()
    while taken & set(range(lo, lo + 41)):
        lo = free_port()
    taken.update(range(lo, lo + 41))

    def pick() -> str:
        while (p := free_port()) in taken:
            pass
        taken.add(p)
        return str(p)

    return ["--node-manager-port", pick(), "--object-manager-port", pick(),
            "--dashboard-agent-listen-port", pick(), "--dashboard-agent-grpc-port", pick(),
            "--runtime-env-agent-port", pick(), "--metrics-export-port", pick(),
            "--min-worker-port", str(lo), "--max-worker-port", str(lo + 40)]


def _common(cpus: int) -> list[str]:
    return ["--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus),
            "--object-store-memory", str(100 << 20), "--disable-usage-stats"]


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus: int = 1) -> Iterator[LocalCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="mpray", dir="/tmp"))  # short: unix socket paths
    port = free_port()
    cluster = LocalCluster(f"127.0.0.1:{port}", tmp, ports={port})
    try:
        _start(cluster, ["--head", "--port", str(port), "--temp-dir", str(tmp),
                         "--include-dashboard", "false", *_common(cpus),
                         *_node_ports(cluster.ports)])
        for _ in range(nodes - 1):
            _start(cluster, ["--address", cluster.address, *_common(cpus),
                             *_node_ports(cluster.ports)])
        _wait_ready(cluster.address, nodes)
        yield cluster
    finally:
        cluster.stop()
