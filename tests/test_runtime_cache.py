"""The expert cache keeps the process within its budget: peak RSS growth while streaming random
experts stays under budget + one acquire's working set + recycled buffers + a small allowance,
and a real budget is actually used (the cache fills)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from moepack.format.synthetic import mixtral_spec, write_synthetic

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@pytest.fixture(scope="module")
def probe():
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("needs make and gcc")
    subprocess.run(["make", "-C", str(ROOT / "runtime"), "build/rel/rss_probe"], check=True,
                   capture_output=True, timeout=600)
    return ROOT / "runtime" / "build" / "rel" / "rss_probe"


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    """One bank of 64 experts with ~1 MiB records (q8, hidden 1024, inter 320)."""
    path = tmp_path_factory.mktemp("rss") / "rss.moepack"
    spec = mixtral_spec(layers=1, experts=64, hidden=1024, inter=320, vocab=64,
                        expert={"name": "q8", "group_size": 32})
    write_synthetic(path, spec, seed="rss", random_experts=True)
    return path


def _run(probe, path, budget, iters=300, n=4):
    out = subprocess.run([str(probe), str(path), str(budget), str(iters), str(n)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    f = out.stdout.split()
    return {f[i]: int(f[i + 1]) for i in range(0, len(f), 2)}


@pytest.mark.parametrize("budget_mib", [0, 8, 24])
def test_rss_stays_within_budget(probe, container, budget_mib):
    r = _run(probe, container, budget_mib * MiB)
    stride = r["stride"]
    assert r["used"] <= budget_mib * MiB
    working_set = 4 * stride                       # one acquire's records
    allowance = 6 * MiB                            # reader thread stacks, malloc metadata
    limit = budget_mib * MiB + working_set + max(working_set, stride) + allowance
    assert r["growth"] <= limit, (r, limit)
    if budget_mib:
        assert r["used"] >= budget_mib * MiB - stride  # the cache really fills its budget
        assert r["growth"] >= r["used"] // 2            # and that memory is resident
        assert r["hits"] > 0
    else:
        assert r["hits"] == 0 and r["used"] == 0
