"""Loopback settings the torrent tests share: sessions listen on 127.0.0.1 only and are given
their peers, so nothing leaves the machine."""

from __future__ import annotations

from moepack.fetch.torrent import FetchOptions, TorrentFetchResult, TorrentPlan

LOCAL = "127.0.0.1:0"


def loopback_opts(*ports: int, stall: float = 20.0) -> FetchOptions:
    """Options for a fetch whose peers are these loopback ports."""
    return FetchOptions(peers=[("127.0.0.1", p) for p in ports], listen=LOCAL,
                        stall_timeout=stall, metadata_timeout=20.0)


def fetched(result: TorrentFetchResult | TorrentPlan) -> TorrentFetchResult:
    """A real fetch's result (not a dry run's plan)."""
    assert isinstance(result, TorrentFetchResult)
    return result
