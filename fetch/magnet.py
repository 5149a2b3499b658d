"""Magnet links carry no metadata: get the info dict from peers before anything else."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence

import libtorrent as lt
from moepack.fetch.errors import FetchError
from moepack.fetch.lt_session import POLL_S, RECONNECT_EVERY_S, connect_peers, drain


def metadata_from_peers(ses: lt.session, params: lt.add_torrent_params,
                        peers: Sequence[tuple[str, int]], timeout: float) -> lt.torrent_info:
    """A magnet has no metadata: get the info dict from peers, writing no payload."""
    key = str(params.info_hashes.get_best())
    scratch = tempfile.mkdtemp(prefix="moepack-magnet-")   # upload mode writes nothing there
    params.save_path = scratch
    params.flags |= lt.torrent_flags.upload_mode
    params.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
    h = ses.add_torrent(params)
    deadline = time.monotonic() + timeout
    last_connect = 0.0
    try:
        while time.monotonic() < deadline:
            a = drain(ses)
            if a.errors:
                raise FetchError(f"magnet {key}: {a.errors[0]}")
            if h.status().has_metadata:
                return lt.torrent_info(h.torrent_file())
            if time.monotonic() - last_connect > RECONNECT_EVERY_S:
                connect_peers(h, list(peers))
                last_connect = time.monotonic()
            time.sleep(POLL_S)
        raise FetchError(f"magnet {key}: no metadata from peers within "
                         f"{timeout:.0f} s")
    finally:
        ses.remove_torrent(h)
        params.flags &= ~lt.torrent_flags.upload_mode
        shutil.rmtree(scratch, ignore_errors=True)
