"""`moepack convert --ray`: a real two-node Ray cluster on this machine (head + one more node,
one CPU each, tests/ray_cluster.py), real conversions across both, outputs byte-identical to
`--jobs 1`; a Ray worker SIGKILLed mid-task (Ray runs the task again); a whole node SIGKILLed
mid-run (its tasks rerun on the survivors, also with an hf: source); the driver SIGKILLed and the
same command rerun (resumed from the journal); an hf: source read by ranges from the fake hub,
also a private one (the driver's token reaches the tasks); no header folder left on the nodes
after a run, finished or failed; Ray missing; an address where nothing answers (refused in
seconds, not after Ray's minutes of retries); a node that cannot see SRC; Ray's own errors
(version mismatch, out of memory) in one line."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from hub_server import HubRepo, HubServer
from moepack.convert.cluster import Source, task_failure
from moepack.convert.errors import SourceError
from moepack.convert.hub_ranges import block_size
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from ray_cluster import free_port, local_cluster
from tiny_models import make_checkpoint

from moepack.safefs import remove_created

pytest.importorskip("ray")

REPO = "org/tiny-dsv3"
FAST = Settings(expert_preset="rvq3-baseline", iters=3)
CLI_FAST = ["--expert-codec", "rvq3-baseline", "--iters", "3"]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(nodes=2, cpus=1) as c:
        yield c


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_checkpoint("deepseek_v3", tmp_path_factory.mktemp("ray") / "src")


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "j1.moepack"
    convert(source, out, FAST, jobs=1)
    return out.read_bytes()


def cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "moepack", "convert", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(p: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out)


def kill_once_journaled(p: subprocess.Popen, journal: Path, experts: int) -> None:
    """SIGKILL the driver's process group once `experts` expert units are journaled (some
    work done, not all)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if journal.exists() and journal.read_text().count("expert:") >= experts:
            break
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()


def kill_a_busy_node(cluster, p: subprocess.Popen) -> list[int]:
    """SIGKILL every process of the first node other than the head seen running an expert
    task, once inside it (some experts encoded, none returned); the PIDs killed."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        busy = [n for n in range(1, len(cluster.groups)) if cluster.task_workers("experts_task", n)]
        if busy:
            time.sleep(1.0)
            return cluster.kill_node(busy[0])
        time.sleep(0.2)
    return []


def header_folders() -> set[Path]:
    """This user's Ray header folders in the nodes' temp dir (the nodes run on this machine)."""
    return set(Path(tempfile.gettempdir()).glob(f"moepack-ray-{os.getuid()}-*"))


@pytest.fixture
def decoy():
    """Another run's header folder: no run may remove it."""
    folder = Path(tempfile.gettempdir()) / f"moepack-ray-{os.getuid()}-{'0' * 16}-decoy"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    yield folder
    (folder / "config.json").unlink()
    folder.rmdir()


def test_two_nodes_byte_identical_to_jobs_1(cluster, source, reference, tmp_path):
    """Expert tasks last ~2.4 s (--pause-per-unit), so while one node is busy the other one
    gets work even on a loaded machine (tiny tasks may all finish on the first node)."""
    out = tmp_path / "ray.moepack"
    summary = finish(cli(str(source), str(out), "--ray", cluster.address, "--json", *CLI_FAST,
                         "--pause-per-unit", "0.3"))
    assert out.read_bytes() == reference
    assert summary["ray_nodes"] == 2            # both nodes ran tasks
    assert summary["plan"]["ray"] == cluster.address
    assert summary["peak_rss_worker"] > 50 << 20
    assert not Path(f"{out}.journal").exists() and not Path(f"{out}.partial").exists()


@pytest.fixture
def hub(source):
    files = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
    with HubServer({REPO: HubRepo(files)}) as server:
        yield server


def hub_env(hub: HubServer) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.base}


@pytest.mark.network
def test_hub_source_two_nodes_read_checked_ranges(cluster, source, reference, hub, tmp_path,
                                                  decoy):
    """hf: + --ray: the driver streams each shard once (SHA-256 checked, not stored); the tasks
    on both nodes read block-aligned ranges; the container equals the local --jobs 1 one; the
    nodes' header folders are gone afterwards (another run's stays)."""
    before = header_folders()
    out = tmp_path / "hub.moepack"
    doc = finish(cli(f"hf:{REPO}", str(out), "--ray", cluster.address, "--json", *CLI_FAST,
                     "--pause-per-unit", "0.3", env=hub_env(hub)))
    assert out.read_bytes() == reference
    assert doc["ray_nodes"] == 2 and doc["plan"]["ray"] == cluster.address
    shards = {p.name: p.stat().st_size for p in source.glob("*.safetensors")}
    s = doc["stream"]
    assert s["peak_staged"] == 0 and s["downloaded"] == s["source_bytes"] == sum(shards.values())
    cdn = {hashlib.sha256((source / n).read_bytes()).hexdigest(): n for n in shards}
    whole, ranges, range_bytes = Counter(), Counter(), 0
    for method, path, rng in hub.requests:
        name = cdn.get(path.removeprefix("/cdn/"))
        if method != "GET" or name is None:
            continue
        if rng is None:
            whole[name] += 1
            continue
        lo, hi = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        block = block_size(shards[name])
        headers = rng == "bytes=0-7" or lo == 8     # planning's header reads
        assert headers or (lo % block == 0 and ((hi + 1) % block == 0 or hi + 1 == shards[name]))
        ranges[name] += not headers
        range_bytes += 0 if headers else hi + 1 - lo
    assert whole == dict.fromkeys(shards, 1)          # the driver's one pass per shard
    assert set(ranges) == set(shards)                 # tasks read every shard by ranges
    by_node = s["fetched_by_node"]                    # what each node's tasks fetched
    assert len(by_node) == 2 and sum(by_node.values()) == range_bytes
    assert all(0 < n < range_bytes for n in by_node.values())   # each only its tasks' part
    assert not Path(f"{out}.staging").exists()
    assert header_folders() == before and decoy.joinpath("config.json").is_file()


@pytest.mark.network
def test_hub_source_range_not_matching_the_verified_shard_stops(cluster, source, hub, tmp_path):
    before = header_folders()
    hub.tampered_ranges.update(hub.cdn)   # whole files right; ranges with a shard's end wrong
    out = tmp_path / "bad.moepack"
    p = cli(f"hf:{REPO}", str(out), "--ray", cluster.address, "--quiet", *CLI_FAST,
            env=hub_env(hub))
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1
    assert "differ from the file whose SHA-256 was verified" in err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert not out.exists()
    assert header_folders() == before           # removed on failure too


@pytest.mark.network
def test_private_hub_token_reaches_the_tasks(cluster, source, reference, tmp_path):
    """The nodes were started without HF_TOKEN: the driver's token goes to the tasks as an
    argument. Without it the run stops in one line; with it the container is identical, and
    the token is in no output."""
    assert "HF_TOKEN" not in os.environ, "the nodes must not inherit a token"
    token = "hf_" + "s3cret" * 4
    files = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
    with HubServer({REPO: HubRepo(files)}, token=token) as hub:
        out = tmp_path / "private.moepack"
        args = [f"hf:{REPO}", str(out), "--ray", cluster.address, "--json", *CLI_FAST]
        p = cli(*args, env=hub_env(hub))
        _, err = p.communicate(timeout=300)
        assert p.returncode == 1 and "Traceback" not in err
        assert "HTTP 401" in err.strip().splitlines()[-1]
        assert not out.exists()
        p = cli(*args, env={**hub_env(hub), "HF_TOKEN": token})
        stdout, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    assert out.read_bytes() == reference
    assert token not in stdout + err
    ranges = {path for method, path, rng in hub.requests if rng and "/resolve/" in path}
    assert ranges and all(hub.authorized.get(path) for path in ranges)   # tasks sent it


@pytest.mark.slow
@pytest.mark.network
def test_hub_source_node_killed_mid_run(cluster, source, reference, hub, tmp_path):
    """As test_node_killed_mid_run_work_moves_to_the_survivors, with tasks reading hub ranges:
    the rerun tasks fetch their ranges again on the survivors; identical to --jobs 1."""
    cluster.add_node()
    out = tmp_path / "hubnode.moepack"
    p = cli(f"hf:{REPO}", str(out), "--ray", cluster.address, "--json", *CLI_FAST,
            "--pause-per-unit", "0.5", env=hub_env(hub))
    killed = kill_a_busy_node(cluster, p)
    assert killed, "no expert task was seen running on a node other than the head"
    doc = finish(p)
    assert out.read_bytes() == reference
    assert doc["ray_nodes"] >= 2
    assert not set(killed) & {pid for pid, _ in cluster.processes()}


@pytest.mark.slow
@pytest.mark.network
def test_hub_source_driver_killed_then_rerun_reuses_verified_shards(cluster, source, reference,
                                                                     hub, tmp_path):
    before = header_folders()
    out = tmp_path / "hubresume.moepack"
    journal = Path(f"{out}.journal")
    args = [f"hf:{REPO}", str(out), "--ray", cluster.address, "--json", *CLI_FAST]
    kill_once_journaled(cli(*args, "--pause-per-unit", "0.5", start_new_session=True,
                            env=hub_env(hub)), journal, experts=4)
    assert not out.exists() and journal.exists()
    left = header_folders() - before          # a SIGKILLed driver cannot clean up
    kept = list(Path(f"{out}.staging").glob(".*.blocks"))
    assert kept                                       # digests of the shards verified so far
    doc = finish(cli(*args, env=hub_env(hub)))
    assert out.read_bytes() == reference
    assert doc["resumed_units"] >= 4
    # a verified shard is not streamed again: its block table was kept
    assert doc["stream"]["downloaded"] <= doc["stream"]["source_bytes"] - sum(
        source.joinpath(k.name[1:].removesuffix(".blocks")).stat().st_size for k in kept)
    assert header_folders() - before == left   # the rerun removed its own, not the killed run's
    for folder in left:
        remove_created(folder, [f.name for f in folder.iterdir()])


@pytest.mark.slow
def test_worker_killed_mid_task_is_retried(cluster, source, reference, tmp_path):
    """--pause-per-unit makes each expert task last ~8 s; one worker running it is SIGKILLed."""
    out = tmp_path / "killed.moepack"
    p = cli(str(source), str(out), "--ray", cluster.address, "--json", *CLI_FAST,
            "--pause-per-unit", "1")
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline and p.poll() is None:
        busy = cluster.task_workers("experts_task")
        if busy:
            time.sleep(1.5)  # well inside the task: some experts encoded, none returned
            victim = busy[0]
            os.kill(victim, signal.SIGKILL)
        else:
            time.sleep(0.2)
    assert victim is not None, "no expert task was seen running"
    finish(p)
    assert out.read_bytes() == reference
    assert victim not in [pid for pid, _ in cluster.processes()]


@pytest.mark.slow
def test_node_killed_mid_run_work_moves_to_the_survivors(cluster, source, reference, tmp_path):
    """A third node joins; the first node other than the head seen running an expert task
    (there are two such tasks, spread over three nodes) has every process SIGKILLed at once
    (the machine died). Ray runs its tasks again on the survivors: the conversion completes,
    identical. Two nodes stay alive for the tests after this one."""
    cluster.add_node()
    out = tmp_path / "node.moepack"
    p = cli(str(source), str(out), "--ray", cluster.address, "--json", *CLI_FAST,
            "--pause-per-unit", "0.5")
    killed = kill_a_busy_node(cluster, p)
    assert killed, "no expert task was seen running on a node other than the head"
    summary = finish(p)
    assert out.read_bytes() == reference
    assert summary["ray_nodes"] >= 2
    assert not set(killed) & {pid for pid, _ in cluster.processes()}   # it stayed dead


@pytest.mark.slow
def test_driver_killed_then_rerun_resumes(cluster, tmp_path):
    # Four expert banks of one task each on two one-CPU nodes run as two waves about 4 s
    # apart, so the kill lands between them; with two banks both tasks end together and the
    # run can finish before the journal is seen.
    source = make_checkpoint("deepseek_v3", tmp_path / "src", num_hidden_layers=5)
    reference = tmp_path / "j1.moepack"
    convert(source, reference, FAST, jobs=1)
    out = tmp_path / "resumed.moepack"
    journal = Path(f"{out}.journal")
    args = [str(source), str(out), "--ray", cluster.address, "--json", *CLI_FAST,
            "--pause-per-unit", "0.5"]
    kill_once_journaled(cli(*args, start_new_session=True), journal, experts=4)
    assert not out.exists() and journal.exists()
    summary = finish(cli(*args[:-2]))
    assert summary["resumed_units"] >= 4
    assert out.read_bytes() == reference.read_bytes()


def test_without_ray_the_error_says_how_to_install(source, tmp_path):
    code = ("import sys; sys.modules['ray'] = None; sys.argv[0] = 'moepack'; "
            "from moepack.cli import app; app()")
    r = subprocess.run([sys.executable, "-c", code, "convert", str(source),
                        str(tmp_path / "o.moepack"), "--ray", "auto"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "pip install 'moepack[cluster]'" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())         # nothing written


def test_jobs_and_ray_exclude_each_other(source, tmp_path):
    r = subprocess.run([sys.executable, "-m", "moepack", "convert", str(source),
                        str(tmp_path / "o.moepack"), "--ray", "auto", "--jobs", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "exclude each other" in r.stderr


def test_address_where_nothing_answers_is_refused_in_seconds(source, tmp_path):
    """ray.init alone retries such an address for about 13 minutes."""
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "moepack", "convert", str(source),
                        str(tmp_path / "o.moepack"), "--ray", address],
                       capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: --ray {address}: cannot connect: nothing answers at {address} (Connection "
        "refused); is the cluster's head running there (ray start --head) and is this its "
        "address (host:port, port 6379 unless --port said otherwise)?"]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("missing", ["folder", "shard"])
def test_a_node_that_cannot_see_src_says_so(source, tmp_path, missing):
    """What a task on a node without the driver's SRC (no shared filesystem) raises."""
    path = tmp_path / "elsewhere" if missing == "folder" else source
    src = Source(str(path), (("absent.safetensors", 1),))
    with pytest.raises(SourceError) as e:
        src.open()
    msg = str(e.value)
    assert msg.startswith(f"{path} on node {os.uname().nodename}: cannot read it there (")
    assert "SRC must be the same path on every node of the cluster" in msg and "\n" not in msg


def test_ray_failures_are_one_line():
    ray = pytest.importorskip("ray")
    oom = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on "
                                          "memory.\nMemory on the node (IP: 10.0.0.2) was "
                                          "15.1GB / 15.5GB (0.97).\n\nRefer to the docs.")
    assert str(task_failure(ray, "layer 3", oom)) == (
        "layer 3: OutOfMemoryError: Task was killed due to the node running low on memory. "
        "Memory on the node (IP: 10.0.0.2) was 15.1GB / 15.5GB (0.97). Refer to the docs.; "
        "rerun the same command to continue")
    crashed = ray.exceptions.RayTaskError("experts_task", "Traceback ...", MemoryError())
    assert str(task_failure(ray, "layer 3", crashed.as_instanceof_cause())) == \
        "layer 3: MemoryError"


def test_ray_version_mismatch_is_one_line(cluster, source, tmp_path):
    ray = pytest.importorskip("ray")
    code = ("import sys, ray; ray.__version__ = '0.0.1'; sys.argv[0] = 'moepack'; "
            "from moepack.cli import app; app()")
    r = subprocess.run([sys.executable, "-c", code, "convert", str(source),
                        str(tmp_path / "o.moepack"), "--ray", cluster.address],
                       capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"Version mismatch: The cluster was started with: Ray: {ray.__version__} " in last
    assert "\\n" not in last
    assert not list(tmp_path.iterdir())
