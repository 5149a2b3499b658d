"""`moepack convert hf:ORG/REPO OUT --staging SIZE` against the fake hub on 127.0.0.1
(tests/hub_server.py): a staging bound smaller than the source, the container byte-identical to
a local conversion, shards deleted once done, --dry-run's peak disk, and kill -9 then rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_server import HubRepo, HubServer
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from moepack.convert.stream_waves import plan_waves
from moepack.convert.tasks import Task
from tiny_models import make_checkpoint

pytestmark = [pytest.mark.network]

REPO = "org/tiny-dsv3"
FAST = Settings(expert_preset="rvq3-baseline", iters=3)
CLI_FAST = ["--expert-codec", "rvq3-baseline", "--iters", "3"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("deepseek_v3", tmp_path_factory.mktemp("stream") / "src")


@pytest.fixture(scope="module")
def reference(checkpoint, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("local") / "local.moepack"
    convert(checkpoint, out, FAST, jobs=1)
    return out.read_bytes()


@pytest.fixture(scope="module")
def hub(checkpoint):
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    with HubServer({REPO: HubRepo(files)}) as server:
        yield server


def shard_sizes(checkpoint: Path) -> list[int]:
    return sorted(p.stat().st_size for p in checkpoint.glob("*.safetensors"))


def cli(hub: HubServer, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "HF_ENDPOINT": hub.base}
    return subprocess.Popen([sys.executable, "-m", "moepack", "convert", f"hf:{REPO}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            **kw)


def finish(p: subprocess.Popen) -> dict:
    return finish_with_progress(p)[0]


def finish_with_progress(p: subprocess.Popen) -> tuple[dict, list[dict]]:
    """The --json summary and the --progress json lines."""
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out), [json.loads(x) for x in err.splitlines() if x.startswith("{")]


def bound(checkpoint: Path) -> int:
    sizes = shard_sizes(checkpoint)
    return sizes[-1] * 3     # half of the six shards, or less


def test_streamed_with_a_small_bound_is_byte_identical(hub, checkpoint, reference, tmp_path):
    out = tmp_path / "m.moepack"
    total = sum(shard_sizes(checkpoint))
    assert len(shard_sizes(checkpoint)) >= 5 and bound(checkpoint) < total * 0.7
    doc, progress = finish_with_progress(cli(hub, str(out), "--staging", str(bound(checkpoint)),
                                             "--json", "--progress", "json",
                                             "--progress-every", "0", *CLI_FAST))
    assert out.read_bytes() == reference
    s = doc["stream"]
    assert 0 < s["peak_staged"] <= bound(checkpoint) < s["source_bytes"] == total
    assert s["downloaded"] == total and s["waves"] >= 2   # each shard once, in several waves
    assert s["prefetched"] >= 1      # some shards downloaded while a wave encoded, within bound
    staged = [d["staged"] for d in progress if "staged" in d]
    assert max(staged) == s["peak_staged"] and min(staged) < max(staged)   # released as it goes
    assert progress[-1]["phase"] == "finished" and progress[-1]["downloaded"] == total
    assert not Path(f"{out}.staging").exists()            # shards and stand-ins removed


def test_dry_run_states_peak_disk_and_downloads_no_shard(hub, checkpoint, tmp_path):
    out = tmp_path / "m.moepack"
    b = bound(checkpoint)
    doc = finish(cli(hub, str(out), "--staging", str(b), "--json", "--dry-run"))
    s = doc["stream"]
    assert s["peak_disk"] == s["container_bytes"] + b + s["small_files"]
    assert s["container_bytes"] > 0 and not out.exists()
    staged = Path(s["staging_dir"])
    blocks = sum(p.stat().st_blocks * 512 for p in staged.glob("*.safetensors"))
    assert blocks < sum(shard_sizes(checkpoint)) / 2     # stand-ins: sparse, headers only
    text = cli(hub, str(out), "--staging", str(b), "--dry-run").communicate(timeout=120)[0]
    assert "peak disk:" in text


def test_dry_run_with_ray_stages_nothing(hub, tmp_path):
    """--ray reads ranges from the hub: no --staging needed, no shard bytes in the peak disk
    (the dry run plans from headers and connects to no cluster)."""
    doc = finish(cli(hub, str(tmp_path / "m.moepack"), "--ray", "127.0.0.1:1", "--json",
                     "--dry-run"))
    s = doc["stream"]
    assert s["staging_bound"] == 0 and s["peak_disk"] == s["container_bytes"] + s["small_files"]


def test_bound_below_the_largest_shard_is_refused(hub, checkpoint, tmp_path):
    p = cli(hub, str(tmp_path / "m.moepack"), "--staging", str(shard_sizes(checkpoint)[-1] - 1))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "smaller than the largest shard" in err


def test_kill_9_then_rerun_redoes_only_missing_work(hub, checkpoint, reference, tmp_path):
    out = tmp_path / "k.moepack"
    journal = Path(f"{out}.journal")
    args = [str(out), "--staging", str(bound(checkpoint)), "--json", *CLI_FAST]
    p = cli(hub, *args, "--pause-per-unit", "0.2", start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if journal.exists() and journal.read_text().count("expert:") >= 6:
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    assert not out.exists() and journal.exists()
    doc = finish(cli(hub, *args))
    assert out.read_bytes() == reference
    assert doc["resumed_units"] >= 6
    assert doc["stream"]["downloaded"] < sum(shard_sizes(checkpoint))  # kept shards reused


def test_waves_fill_half_the_bound_so_the_next_can_download_meanwhile():
    sizes = {"a": 4, "b": 4, "c": 4, "d": 9}
    needs = [{"a"}, {"a"}, {"b"}, {"b", "c"}, {"d"}]
    work = [(Task(f"t{i}", ()), frozenset(n)) for i, n in enumerate(needs)]
    waves = plan_waves(work, sizes, 10)
    assert [[t.key for t, _ in w] for w, _ in waves] == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]
    assert [sorted(n) for _, n in waves] == [["a"], ["b"], ["b", "c"], ["d"]]


def test_a_staged_plain_file_changed_upstream_is_fetched_again(checkpoint, tmp_path):
    """generation_config.json (a plain file: the hub lists no SHA-256 for it, its git blob hash
    tells) staged by a run at one commit, then changed at the same size in the next commit:
    the next run downloads it again instead of converting the old end-of-text id."""
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    out, b = tmp_path / "m.moepack", bound(checkpoint)
    with HubServer({REPO: HubRepo(files)}) as first:
        stage = Path(finish(cli(first, str(out), "--staging", str(b), "--json",
                                "--dry-run"))["stream"]["staging_dir"])
    staged = stage / "generation_config.json"
    old = staged.read_bytes()
    assert old == files["generation_config.json"] and b'"eos_token_id": 2' in old
    files["generation_config.json"] = old.replace(b'"eos_token_id": 2', b'"eos_token_id": 3')
    with HubServer({REPO: HubRepo(files, commit="89abcdef" * 5)}) as second:
        finish(cli(second, str(out), "--staging", str(b), "--json", "--dry-run"))
    assert staged.read_bytes() == files["generation_config.json"]
