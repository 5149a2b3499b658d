"""The size of the container `convert` will write, from config.json, before anything is fetched."""

from __future__ import annotations

import json
from pathlib import Path

from moepack.fetch.hub_download import resolve_url
from moepack.fetch.hub_listing import RepoListing

MAX_CONFIG_BYTES = 16 << 20


def _config(listing: RepoListing, dest: Path) -> dict:
    local = dest / "config.json"
    if local.is_file() and local.stat().st_size <= MAX_CONFIG_BYTES:
        try:
            return json.loads(local.read_text(encoding="utf-8"))
        except ValueError:
            pass   # damaged local copy: ask the hub
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    url = resolve_url(listing.repo, listing.revision, "config.json")
    r = get_session().get(url, headers=build_hf_headers(), timeout=httpx2.Timeout(30.0))
    if r.status_code != 200 or len(r.content) > MAX_CONFIG_BYTES:
        raise ValueError(f"config.json: HTTP {r.status_code} from {url}")
    return json.loads(r.content)


def conversion_size(listing: RepoListing, dest: Path) -> tuple[int | None, str]:
    """(bytes, how it was obtained) — or (None, why not) when it cannot be computed."""
    if not any(f.name == "config.json" for f in listing.files):
        return None, "no config.json in the selected files"
    import httpx2

    try:
        config = _config(listing, dest)
    except (ValueError, OSError, httpx2.HTTPError) as e:
        return None, f"config.json unreadable: {e}"
    try:
        from moepack.convert.plan import plan_for_config
        from moepack.convert.settings import Settings
        from moepack.convert.source import BLOB_FILES
    except ImportError as e:
        return None, f"layout planner not available ({e})"
    files = [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in listing.files
             if f.name.endswith(".safetensors")]
    blobs = {f.name: f.size for f in listing.files if f.name in BLOB_FILES}
    try:
        layout = plan_for_config(config, Settings(), files=files, blobs=blobs)
    except Exception as e:   # noqa: BLE001 — any planner refusal becomes the reason shown
        return None, f"planner: {e}"
    return int(layout.file_size), "exact: config.json through the layout planner, default settings"
