"""The BitTorrent side of moepack.fetch, in one import: create, fetch, seed."""

from moepack.fetch.seed import Seeder, SeedStatus, seed_in_background
from moepack.fetch.torrent_create import auto_piece_size, create_torrent, write_torrent
from moepack.fetch.torrent_fetch import (
    FetchOptions,
    Progress,
    TorrentFetchResult,
    TorrentPlan,
    fetch_torrent,
)

__all__ = [
    "FetchOptions", "Progress", "SeedStatus", "Seeder", "TorrentFetchResult", "TorrentPlan",
    "auto_piece_size", "create_torrent", "fetch_torrent", "seed_in_background", "write_torrent",
]
