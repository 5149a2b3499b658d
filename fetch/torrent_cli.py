"""What the torrent-side commands print; the work is in torrent_create/torrent_fetch/seed."""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path

import libtorrent as lt
import rich.progress
from moepack.fetch.display import console, transfer_bar, verdict_table
from moepack.fetch.errors import FetchError
from moepack.fetch.lt_session import parse_endpoint
from moepack.fetch.seed import Seeder
from moepack.fetch.torrent_create import (
    check_output,
    create_torrent,
    source_file,
    write_torrent,
)
from moepack.fetch.torrent_fetch import FetchOptions, Progress, TorrentPlan, fetch_torrent

from moepack.sizes import format_size, parse_size


def run_create(file: Path, output: Path | None, piece_size: str | None, trackers: list[str],
               web_seeds: list[str]) -> None:
    try:
        piece = parse_size(piece_size) if piece_size else None
    except ValueError as e:
        raise FetchError(f"--piece-size: {e}") from e
    out = output or file.with_name(file.name + ".torrent")
    src = source_file(file)
    check_output(out, src)
    t0 = time.perf_counter()
    size = src.stat().st_size   # checked before the bar: the error is one line
    with transfer_bar("hashing", size) as (bar, task):   # SHA-1 + SHA-256 of every byte
        def show(done: int, num: int) -> None:
            bar.update(task, completed=size * done // max(num, 1))

        data = create_torrent(file, piece_size=piece, trackers=trackers, web_seeds=web_seeds,
                              progress=show)
    write_torrent(data, out, src)
    ti = lt.torrent_info(data)
    ih = ti.info_hashes()
    console.print(f"wrote {out} in {time.perf_counter() - t0:.1f} s: {ti.num_pieces()} pieces of "
                  f"{format_size(ti.piece_length())}, {ti.comment()}", highlight=False,
                  soft_wrap=True, markup=False)
    console.print(f"info-hash v1 {ih.v1}  v2 {ih.v2}", highlight=False, soft_wrap=True)
    console.print(lt.make_magnet_uri(ti), highlight=False, soft_wrap=True, markup=False)


def run_torrent_fetch(source: str, dest: Path, dry_run: bool, peers: list[str],
                      listen: str | None, stall_timeout: float) -> int:
    endpoints = [parse_endpoint(p, "--peer") for p in peers]
    if dry_run:
        result = fetch_torrent(source, dest, dry_run=True,
                               opts=FetchOptions(endpoints, listen, stall_timeout=stall_timeout))
        assert isinstance(result, TorrentPlan)
        return _print_plan(result)
    with ExitStack() as stack:
        shown: list[tuple[rich.progress.Progress, int]] = []

        def show(p: Progress) -> None:
            # The bar appears with the first progress, so a refusal before it stays one line.
            if not shown:
                shown.append(stack.enter_context(transfer_bar("fetch", p.total)))
            bar, task = shown[0]
            bar.update(task, total=p.total, completed=p.done, info=f"{p.peers} peers, {p.state}")

        opts = FetchOptions(endpoints, listen, stall_timeout=stall_timeout, progress=show)
        result = fetch_torrent(source, dest, opts=opts)
    assert not isinstance(result, TorrentPlan)
    if result.already_complete:
        console.print(f"{result.path} is already complete and verifies: {result.container_id}",
                      markup=False)
        return 0
    console.print(f"{result.path}: verified, container {result.container_id}; downloaded "
                  f"{format_size(result.downloaded_bytes)} in {result.seconds:.1f} s "
                  f"({result.pieces_at_start}/{result.pieces} pieces were already valid)",
                  highlight=False, soft_wrap=True, markup=False)
    return 0


def _print_plan(p: TorrentPlan) -> int:
    m = p.meta
    console.print(f"{m.source}: {m.name}, {format_size(m.size)} ({m.size} bytes), "
                  f"{m.num_pieces} pieces "
                  f"of {format_size(m.piece_length)}, container {m.container_id or 'not stated'}",
                  highlight=False, soft_wrap=True, markup=False)
    if p.present:
        console.print(f"already on disk (partial or damaged copy): {format_size(p.present)}")
    console.print(verdict_table([p.verdict]))
    return 0 if p.verdict.ok else 1


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt   # so `with Seeder` closes the session cleanly


def run_seed(torrent: Path, path: Path, listen: str, full_verify: bool, duration: float) -> None:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        _seed_loop(torrent, path, listen, full_verify, duration)
    except KeyboardInterrupt:
        console.print("stopped")


def _seed_loop(torrent: Path, path: Path, listen: str, full_verify: bool, duration: float) -> None:
    with Seeder(torrent, path, listen=listen, full_verify=full_verify) as s:
        console.print(f"seeding {path} ({s.meta.container_id}) on port {s.port}", highlight=False,
                      soft_wrap=True, markup=False)
        t0 = time.monotonic()
        with console.status("") as status:
            while duration <= 0 or time.monotonic() - t0 < duration:
                st = s.status()
                if st.error:
                    raise FetchError(f"seeding {path}: {st.error}")
                # seed_mode checks each piece on first request; a failed one leaves the set.
                bad = st.num_pieces - st.pieces
                warn = f", [red]{bad} pieces failed their check (repair: fetch)[/]" if bad else ""
                status.update(f"{st.peers} peers, up {format_size(st.upload_rate)}/s, "
                              f"{format_size(st.uploaded)} sent{warn}")
                time.sleep(1.0)
