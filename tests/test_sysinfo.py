"""moepack.sysinfo (usable cores and memory, cgroup v1/v2) and convert's default --jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from moepack.convert.jobs import choose_jobs

from moepack import sysinfo

GiB = 1 << 30


MEMINFO = "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"


def machine(tmp: Path, cgroup_lines: list[str], files: dict[str, str],
            meminfo: str = MEMINFO) -> tuple[Path, Path]:
    """A fake /proc and /sys/fs/cgroup: `files` maps paths under the cgroup root to contents."""
    proc, cg = tmp / "proc", tmp / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    (proc / "meminfo").write_text(meminfo)
    cg.mkdir()
    for rel, text in files.items():
        (cg / rel).parent.mkdir(parents=True, exist_ok=True)
        (cg / rel).write_text(text)
    return proc, cg


def test_v2_cpu_max_tightest_ancestor_rounded_up(tmp_path):
    proc, cg = machine(tmp_path, ["0::/a/b"], {
        "cgroup.controllers": "cpu memory\n",
        "a/cpu.max": "150000 100000\n",      # 1.5 CPUs on the parent: the tightest
        "a/b/cpu.max": "max 100000\n",
    })
    c = sysinfo.cores(proc, cg, affinity=8)
    assert c.quota == pytest.approx(1.5)
    assert c.usable == 2 and c.affinity == 8
    assert sysinfo.cores(proc, cg, affinity=1).usable == 1   # affinity is tighter


def test_v1_cfs_quota_in_a_joined_hierarchy(tmp_path):
    proc, cg = machine(tmp_path, ["4:memory:/job", "2:cpu,cpuacct:/job", "0::/"], {
        "cpu,cpuacct/job/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "memory/job/memory.limit_in_bytes": f"{3 * GiB}\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n",   # v1 "no limit"
    })
    assert sysinfo.cores(proc, cg, affinity=16).usable == 3
    m = sysinfo.memory(proc, cg)
    assert m.cgroup_limit == 3 * GiB and m.usable == 3 * GiB
    assert m.limit_file.endswith("memory/job/memory.limit_in_bytes")


def test_no_quota_no_limit_uses_affinity_and_memavailable(tmp_path):
    proc, cg = machine(tmp_path, ["0::/"], {"cgroup.controllers": "", "cpu.max": "max 100000"})
    assert sysinfo.cores(proc, cg, affinity=4) == sysinfo.Cores(4, 4, None)
    m = sysinfo.memory(proc, cg)
    assert m.usable == 8 * GiB and m.total == 16 * GiB and m.cgroup_limit is None


def test_v2_memory_high_below_max(tmp_path):
    proc, cg = machine(tmp_path, ["0::/svc"], {
        "cgroup.controllers": "memory",
        "svc/memory.max": f"{4 * GiB}\n", "svc/memory.high": f"{2 * GiB}\n",
    })
    assert sysinfo.memory(proc, cg).usable == 2 * GiB


def test_unreadable_files_mean_unknown_not_a_crash(tmp_path):
    proc, cg = machine(tmp_path, ["garbage", "0::/x"], {
        "cgroup.controllers": "", "x/cpu.max": "lots\n", "x/memory.max": "\xff\n"}, meminfo="")
    assert sysinfo.cores(proc, cg, affinity=2).usable == 2
    assert sysinfo.memory(proc, cg).usable is None


def test_this_machine_is_sane():
    c, m = sysinfo.cores(), sysinfo.memory()
    assert 1 <= c.usable <= c.affinity
    assert m.usable is None or 0 < m.usable <= (m.total or m.usable)


def test_default_jobs_is_cores_bounded_by_memory():
    per = 1500 << 20
    c = choose_jobs(None, per, cores=64, memory=12 * GiB)
    assert (c.jobs, c.memory_allows, c.auto) == (8, 8, True)
    assert c.describe() == "jobs: 8 (64 usable cores, memory allows 8)"
    assert choose_jobs(None, per, cores=2, memory=60 * GiB).jobs == 2
    assert choose_jobs(None, per, cores=4, memory=GiB).jobs == 1       # never below 1
    assert choose_jobs(None, per, cores=3, memory=None).jobs == 3
    given = choose_jobs(5, per, cores=2, memory=GiB)
    assert given.jobs == 5 and not given.auto and given.describe().endswith("from --jobs)")


def test_dry_run_prints_the_choice(tmp_path):
    from tiny_models import make_checkpoint

    src = make_checkpoint("mixtral", tmp_path / "src")
    out = subprocess.run([sys.executable, "-m", "moepack", "convert", str(src),
                          str(tmp_path / "o.moepack"), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cores = sysinfo.usable_cores()
    line = next(x for x in out.stdout.splitlines() if x.startswith("jobs: "))
    assert line.startswith(f"jobs: {cores} ({cores} usable cores, memory allows ")
    js = subprocess.run([sys.executable, "-m", "moepack", "convert", str(src),
                         str(tmp_path / "o.moepack"), "--dry-run", "--json", "-j", "1"],
                        capture_output=True, text=True, timeout=120)
    plan = json.loads(js.stdout)["plan"]
    assert plan["jobs"] == 1 and plan["jobs_choice"].endswith("from --jobs)")


# The engine's default thread count (runtime/src/memplan.c mp_usable_cores) against this
# module's rule on the same fake machines: (cgroup lines, files, affinity).
CORE_MACHINES = {
    "v2-ancestor-1.5": (["0::/a/b"], {"cgroup.controllers": "cpu\n", "a/cpu.max": "150000 100000\n",
                                      "a/b/cpu.max": "max 100000\n"}, 8),
    "v2-affinity-tighter": (["0::/a"], {"cgroup.controllers": "cpu\n",
                                        "a/cpu.max": "400000 100000\n"}, 3),
    "v2-quota-only": (["0::/"], {"cgroup.controllers": "", "cpu.max": "250000\n"}, 16),
    "v2-small-quota": (["0::/"], {"cgroup.controllers": "", "cpu.max": "20000 100000\n"}, 4),
    "hybrid": (["1:cpu:/", "0::/j"], {"unified/j/cpu.max": "200000 100000\n"}, 6),
    "v1-joined": (["4:memory:/job", "2:cpu,cpuacct:/job", "0::/"], {
        "cpu,cpuacct/job/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n"}, 16),
    "v1-own-dir-no-period": (["3:cpu:/x/y"], {"cpu/x/cpu.cfs_quota_us": "50000\n"}, 2),
    "none": (["0::/"], {"cgroup.controllers": "", "cpu.max": "max 100000"}, 4),
    "garbage": (["garbage", "0::/x"], {"cgroup.controllers": "", "x/cpu.max": "lots\n",
                                       "cpu.max": "150000 x\n"}, 2),
}


@pytest.mark.parametrize("name", sorted(CORE_MACHINES))
def test_engine_counts_cores_as_sysinfo_does(tmp_path: Path, name: str) -> None:
    import ctypes

    from moepack.runtime._lib import load

    lines, files, affinity = CORE_MACHINES[name]
    proc, cg = machine(tmp_path, lines, files)
    fn = load().mp_usable_cores_at
    fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int], ctypes.c_int
    want = sysinfo.cores(proc, cg, affinity=affinity).usable
    assert fn(str(proc).encode(), str(cg).encode(), affinity) == want


@pytest.mark.parametrize("cpus", [None, "0"])
def test_engine_default_threads_are_the_usable_cores(cpus: str | None) -> None:
    """Opened with threads=0, the engine runs as many compute threads as
    sysinfo.usable_cores() says, also when the process is pinned to one CPU (taskset)."""
    import shutil

    if cpus is not None and shutil.which("taskset") is None:
        pytest.skip("no taskset")
    vector = Path(__file__).parents[1] / "spec" / "vectors" / "valid" / "mixtral2.moepack"
    code = ("from moepack.runtime.engine import Engine; from moepack import sysinfo\n"
            f"with Engine({str(vector)!r}) as e: print(e.threads, sysinfo.usable_cores())")
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(["taskset", "-c", cpus, *cmd] if cpus else cmd, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    engine, python = map(int, out.stdout.split())
    assert engine == python
    if cpus == "0":
        assert engine == 1
