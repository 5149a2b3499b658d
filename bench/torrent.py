"""Benchmark of moepack's BitTorrent side against the disk it runs on.

    nice -n 19 python -m bench.torrent [--size-gb 1.0] [--dir DIR]

Builds a synthetic container of about --size-gb (bench.verify's builder: f16 experts, random-
looking bytes) in DIR (default: a temp dir under /tmp), then measures, in one run:
(a) the disk's O_DIRECT sequential read bandwidth on that file (bench.disk probe);
(b) `torrent create` (SHA-1 + SHA-256 of every byte, cold cache) vs reading the file once;
(c) a loopback transfer: seed_in_background + fetch_torrent between two libtorrent sessions in
    this process (cold cache on the seeding side); rate until the last piece, as a ratio of (a),
    then the fetch's full verify + rename on top.
Everything is deleted at the end. Prints a markdown block for docs/FETCH.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from moepack.fetch.torrent import (
    FetchOptions,
    Progress,
    TorrentFetchResult,
    create_torrent,
    fetch_torrent,
    seed_in_background,
    write_torrent,
)

from bench.disk import drop_cache, sequential_read
from bench.machine import git_commit, machine_line, utc_now
from bench.verify import build


def transfer(path: Path, torrent: Path,
             dest: Path) -> tuple[float, float, float, TorrentFetchResult]:
    """(seconds until every piece arrived, CPU seconds of this process until then,
    seconds in all incl. verify, result). Both sessions run in this process."""
    drop_cache(path)
    done_at: list[tuple[float, float]] = []

    def on_progress(p: Progress) -> None:
        if p.done >= p.total and not done_at:
            done_at.append((time.perf_counter(), time.process_time()))

    with seed_in_background(torrent, path) as seeder:
        opts = FetchOptions(peers=[("127.0.0.1", seeder.port)], listen="127.0.0.1:0",
                            stall_timeout=60, progress=on_progress)
        t0, cpu0 = time.perf_counter(), time.process_time()
        result = fetch_torrent(str(torrent), dest, opts=opts)
        t1 = time.perf_counter()
    assert isinstance(result, TorrentFetchResult) and done_at
    return done_at[0][0] - t0, done_at[0][1] - cpu0, t1 - t0, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="moepack-bench-torrent-", dir=args.dir))
    try:
        path = work / "bench.moepack"
        build(path, args.size_gb)
        size = path.stat().st_size
        load0 = os.getloadavg()[0]
        drop_cache(path)
        disk = sequential_read(path)
        drop_cache(path)
        t = time.perf_counter()
        data = create_torrent(path)
        create_s = time.perf_counter() - t
        torrent = work / "bench.torrent"
        write_torrent(data, torrent)
        move_s, move_cpu, total_s, result = transfer(path, torrent, work / "dest")
        load1 = os.getloadavg()[0]
        if result.path.read_bytes()[:4096] != path.read_bytes()[:4096]:
            raise SystemExit("fetched copy differs")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gb = size / 1e9
    read_s = gb / disk.gb_per_s
    rate = gb / move_s
    print(f"""
### bench/torrent.py — {utc_now()}, commit {git_commit()}

{machine_line()}; load average {load0:.1f} → {load1:.1f} (shared machine);
container {gb:.2f} GB, {result.pieces} pieces.

| measurement | value |
|---|---|
| disk sequential read (O_DIRECT {disk.o_direct}) | {disk.gb_per_s:.2f} GB/s, {read_s:.1f} s \
for the file |
| `torrent create`, cold cache | {create_s:.1f} s = {create_s / read_s:.2f} × one read |
| loopback transfer, to the last piece | {move_s:.1f} s = {rate:.2f} GB/s = \
{rate / disk.gb_per_s:.2f} × disk read |
| CPU time of both sessions during the transfer | {move_cpu:.1f} s = {move_cpu / gb:.1f} s/GB |
| fetch in all (transfer + full verify + rename) | {total_s:.1f} s |
""")


if __name__ == "__main__":
    main()
