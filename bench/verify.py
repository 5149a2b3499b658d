"""Benchmark of `moepack verify` against the disk and against BLAKE3 itself.

    python -m bench.verify [--size-gb 1.5] [--dir DIR] [--repeat 3]

Builds a synthetic container of about --size-gb (f16 experts of 12 MiB, random-looking bytes) in
DIR (default: a temp dir on the same disk as /tmp), then measures, in one run:
(a) cold: the disk's O_DIRECT sequential read bandwidth (bench.disk probe, before and after) and
    a full verify with O_DIRECT reads of the same file -> ratio (goal >= 0.9);
(b) warm: the file in the page cache, full verify with buffered reads at 1 thread and at all
    cores -> GB/s per core, wall clock and per CPU-second (goal > 2 GB/s per core);
plus single-thread BLAKE3 on in-memory data as the hashing ceiling. The container is deleted at
the end. Prints a markdown block for docs/VERIFY.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import blake3
from moepack.format.synthetic import F16, mixtral_spec, write_synthetic
from moepack.verify import Report, verify
from moepack.verify.container import default_threads

from bench.disk import drop_cache, sequential_read
from bench.machine import git_commit, machine_line, utc_now

HIDDEN, INTER, LAYERS = 2048, 1024, 4
RECORD = 3 * HIDDEN * INTER * 2  # gate + up + down in f16: 12 MiB


def build(path: Path, size_gb: float) -> None:
    experts = max(1, round(size_gb * 1e9 / RECORD / LAYERS))
    spec = mixtral_spec(layers=LAYERS, experts=experts, hidden=HIDDEN, inter=INTER, vocab=1024,
                        heads=16, kv_heads=4, expert=F16)
    write_synthetic(path, spec)


def timed_verify(path: Path, **kw: object) -> tuple[Report, float]:
    """The report and the CPU seconds this process spent in it (all threads)."""
    cpu0 = time.process_time()
    r = verify(path, **kw)  # type: ignore[arg-type]
    cpu = time.process_time() - cpu0
    if not r.ok:
        raise SystemExit(f"verify failed on a fresh container: {r.error or r.damaged}")
    return r, cpu


def warm_up(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def blake3_ceiling(mib: int = 256) -> tuple[float, float]:
    """Single-thread BLAKE3 on in-memory data: (GB/s wall, GB per CPU-second)."""
    data = os.urandom(mib << 20)
    t0, c0 = time.perf_counter(), time.process_time()
    blake3.blake3(data).digest()
    return (len(data) / (time.perf_counter() - t0) / 1e9,
            len(data) / (time.process_time() - c0) / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.5)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cores = default_threads()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="moepack-bench-verify-") as tmp:
        path = Path(tmp) / "bench.moepack"
        t0 = time.perf_counter()
        build(path, args.size_gb)
        size = path.stat().st_size
        print(f"built {size / 1e9:.2f} GB container in {time.perf_counter() - t0:.1f} s")

        # (a) cold: disk probe, O_DIRECT verify, disk probe again (the disk is shared).
        disk, cold, cold_cpu = [], [], []
        for _ in range(args.repeat):
            drop_cache(path)
            disk.append(sequential_read(path).gb_per_s)
            drop_cache(path)
            r, cpu = timed_verify(path, io="direct")
            assert r.direct_io, "O_DIRECT was not used"
            cold.append(r.gb_per_s)
            cold_cpu.append(r.bytes_checked / cpu / 1e9)
        drop_cache(path)
        disk.append(sequential_read(path).gb_per_s)

        # (b) warm: everything in the page cache.
        warm_up(path)
        one, one_cpu, all_, all_cpu = [], [], [], []
        for _ in range(args.repeat):
            r, cpu = timed_verify(path, io="buffered", threads=1)
            one.append(r.gb_per_s)
            one_cpu.append(r.bytes_checked / cpu / 1e9)
            r, cpu = timed_verify(path, io="buffered", threads=cores)
            all_.append(r.gb_per_s)
            all_cpu.append(r.bytes_checked / cpu / 1e9)
    ceiling, ceiling_cpu = blake3_ceiling()
    load1 = os.getloadavg()[0]

    med = statistics.median
    disk_gbs, cold_gbs = med(disk), med(cold)
    print()
    print(f"- Measured {utc_now()}, commit {git_commit()}, {machine_line()}.")
    print(f"- Container: {size / 1e9:.2f} GB, {LAYERS} layers of 12 MiB f16 expert records; "
          f"medians of {args.repeat} runs (disk probe: {len(disk)} runs).")
    print("- Cold (O_DIRECT): disk sequential read "
          f"{disk_gbs:.2f} GB/s (runs: {', '.join(f'{x:.2f}' for x in disk)}); "
          f"verify {cold_gbs:.2f} GB/s (runs: {', '.join(f'{x:.2f}' for x in cold)}); "
          f"**ratio {cold_gbs / disk_gbs:.2f}** (goal >= 0.9); "
          f"{med(cold_cpu):.2f} GB hashed per CPU-second.")
    print(f"- Warm (page cache), 1 thread: {med(one):.2f} GB/s wall, "
          f"{med(one_cpu):.2f} GB per CPU-second (**per core**, goal > 2).")
    print(f"- Warm, {cores} threads: {med(all_):.2f} GB/s wall = {med(all_) / cores:.2f} GB/s "
          f"per core; {med(all_cpu):.2f} GB per CPU-second.")
    print(f"- Ceiling: BLAKE3 alone on in-memory data, 1 thread: {ceiling:.2f} GB/s wall, "
          f"{ceiling_cpu:.2f} GB per CPU-second.")
    print(f"- Load average (1 min) at start / end: {load0:.1f} / {load1:.1f} on {cores} cores.")


if __name__ == "__main__":
    main()
