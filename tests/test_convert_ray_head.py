"""`moepack convert --ray` when the cluster's head dies mid-run or while the driver hashes
(tests/ray_cluster.py, a cluster of its own, since this one is killed): the driver stops in one
line of its own, well before Ray would end it without a word, keeps what it wrote, and the same
conversion resumed locally (`--jobs 2`) is byte-identical to `--jobs 1`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from ray_cluster import local_cluster
from tiny_models import make_checkpoint

pytest.importorskip("ray")

FAST = Settings(expert_preset="rvq3-baseline", iters=3)
CLI_FAST = ["--expert-codec", "rvq3-baseline", "--iters", "3"]
RECONNECT = 30      # Ray ends a driver that lost its head this long; moepack stops at a third


def journaled_experts(journal: Path) -> int:
    return journal.read_text().count("expert:") if journal.exists() else 0


def _kill_head_once(p: subprocess.Popen, cluster, ready: Callable[[], bool], late: str) -> None:
    """Kills the head once `ready()`, then checks the driver's end: moepack's own last line,
    no traceback, within the reconnect timeout (before Ray's own exit)."""
    deadline = time.monotonic() + 120
    while p.poll() is None and not ready():
        assert time.monotonic() < deadline, late
        time.sleep(0.1)
    cluster.kill_node(0)
    killed = time.monotonic()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "Traceback" not in err, err[-2000:]
    assert "head stopped answering" in err.strip().splitlines()[-1], err[-2000:]
    assert time.monotonic() - killed < RECONNECT


@pytest.mark.slow
def test_head_killed_mid_run_stops_in_one_line_then_resumes(tmp_path):
    source = make_checkpoint("deepseek_v3", tmp_path / "src", num_hidden_layers=5)
    reference = tmp_path / "j1.moepack"
    convert(source, reference, FAST, jobs=1)
    out = tmp_path / "head.moepack"
    journal = Path(f"{out}.journal")
    env = {**os.environ, "RAY_gcs_rpc_server_reconnect_timeout_s": str(RECONNECT)}
    with local_cluster(nodes=1, cpus=1) as cluster:
        p = subprocess.Popen([sys.executable, "-m", "moepack", "convert", str(source), str(out),
                              "--ray", cluster.address, "--quiet", *CLI_FAST,
                              "--pause-per-unit", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _kill_head_once(p, cluster, lambda: journaled_experts(journal) >= 2,
                        "no expert was journaled")
    assert journaled_experts(journal) >= 2 and Path(f"{out}.partial").exists()
    r = subprocess.run([sys.executable, "-m", "moepack", "convert", str(source), str(out),
                        "--jobs", "2", "--json", *CLI_FAST],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["resumed_units"] >= 2
    assert out.read_bytes() == reference.read_bytes()


# Runs the CLI with the hash pass slowed (in short steps, as hashing reads in chunks) and a file
# made when it starts: the head is then killed while the driver is connected but not running.
_SLOW_HASH = """
import sys, time
from pathlib import Path
from moepack.convert import pipeline
real, mark, seconds = pipeline.fingerprint, Path(sys.argv[1]), float(sys.argv[2])
def slow(*a, **k):
    mark.touch()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    return real(*a, **k)
pipeline.fingerprint = slow
from moepack.cli import app
sys.argv = ["moepack", *sys.argv[3:]]
app()
"""


@pytest.mark.slow
def test_head_killed_before_run_stops_in_one_line(tmp_path):
    source = make_checkpoint("deepseek_v3", tmp_path / "src", num_hidden_layers=2)
    out = tmp_path / "head.moepack"
    hashing = tmp_path / "hashing"
    env = {**os.environ, "RAY_gcs_rpc_server_reconnect_timeout_s": str(RECONNECT)}
    with local_cluster(nodes=1, cpus=1) as cluster:
        p = subprocess.Popen([sys.executable, "-c", _SLOW_HASH, str(hashing), str(2 * RECONNECT),
                              "convert", str(source), str(out), "--ray", cluster.address,
                              "--quiet", *CLI_FAST],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _kill_head_once(p, cluster, hashing.exists, "the hash pass did not start")
    assert not out.exists()
