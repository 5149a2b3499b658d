"""Loopback settings the torrent tests share: sessions listen on 127.0.0.1 only and are given
their peers, so nothing leaves the machine."""

from __future__ import annotations

from pathlib import Path

from moepack.fetch.torrent import (
    FetchOptions,
    TorrentFetchResult,
    TorrentPlan,
    create_torrent,
    write_torrent,
)
from moepack.format.synthetic import mixtral_spec, write_synthetic

LOCAL = "127.0.0.1:0"


def loopback_opts(*ports: int, stall: float = 20.0) -> FetchOptions:
    """Options for a fetch whose peers are these loopback ports."""
    return FetchOptions(peers=[("127.0.0.1", p) for p in ports], listen=LOCAL,
                        stall_timeout=stall, metadata_timeout=20.0)


def fetched(result: TorrentFetchResult | TorrentPlan) -> TorrentFetchResult:
    """A real fetch's result (not a dry run's plan)."""
    assert isinstance(result, TorrentFetchResult)
    return result


def small_torrent(d: Path) -> tuple[Path, Path, str]:
    """A ~0.5 MB container in `d` and its torrent (16 KiB pieces): (container, torrent, ID)."""
    path = d / "tiny.moepack"
    cid = write_synthetic(path, mixtral_spec(layers=2, experts=8, hidden=128, inter=64))
    write_torrent(create_torrent(path), d / "tiny.torrent")
    return path, d / "tiny.torrent", cid
