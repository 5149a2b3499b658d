"""The size of the container `convert` will write, from config.json, before anything is fetched."""

from __future__ import annotations

from pathlib import Path

from moepack.fetch.hub_download import resolve_url
from moepack.fetch.hub_listing import RepoListing
from moepack.format.model_desc import MAX_JSON_BYTES as MAX_CONFIG_BYTES

INDEX = "model.safetensors.index.json"


def _repo_json(listing: RepoListing, dest: Path, name: str) -> object:
    """A small JSON file of the repository (config.json, the safetensors index), parsed by the
    converter's bounded parser (size and nesting depth); the local copy when it reads."""
    from moepack.convert.st_header import parse_json

    local = dest / name
    if local.is_file() and local.stat().st_size <= MAX_CONFIG_BYTES:
        try:
            return parse_json(local.read_bytes(), name)
        except (ValueError, OSError):
            pass   # damaged local copy: ask the hub
    import httpx2
    from huggingface_hub.utils import build_hf_headers, get_session

    url = resolve_url(listing.repo, listing.revision, name)
    body = bytearray()
    with get_session().stream("GET", url, headers=build_hf_headers(),
                              timeout=httpx2.Timeout(30.0)) as r:
        if r.status_code != 200:
            raise ValueError(f"{name}: HTTP {r.status_code} from {url}")
        for part in r.iter_bytes():   # streamed: a hostile hub cannot make us hold more
            body += part
            if len(body) > MAX_CONFIG_BYTES:
                raise ValueError(f"{name}: larger than {MAX_CONFIG_BYTES:,} bytes")
    return parse_json(bytes(body), name)


def _declares_mtp(config: dict) -> bool:
    text = config.get("text_config")
    return bool(config.get("num_nextn_predict_layers")
                or (isinstance(text, dict) and text.get("num_nextn_predict_layers")))


def _tensor_names(listing: RepoListing, dest: Path) -> list[str] | None:
    """The checkpoint's tensor names from its safetensors index, which say whether the declared
    multi-token-prediction layers are there (FORMAT.md §4.6); None without an index."""
    if not any(f.name == INDEX for f in listing.files):
        return None
    doc = _repo_json(listing, dest, INDEX)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{INDEX}: 'weight_map' is not an object")
    return list(weight_map)


def conversion_size(listing: RepoListing, dest: Path) -> tuple[int | None, str]:
    """(bytes, how it was obtained) — or (None, why not) when it cannot be computed."""
    if not any(f.name == "config.json" for f in listing.files):
        return None, "no config.json in the selected files"
    import httpx2
    from moepack.convert.errors import ConvertError

    try:
        config = _repo_json(listing, dest, "config.json")
    except (ValueError, OSError, httpx2.HTTPError, ConvertError) as e:
        return None, f"config.json unreadable: {e}"
    if not isinstance(config, dict):
        return None, "config.json unreadable: not a JSON object"
    try:
        from moepack.convert.plan import plan_for_config
        from moepack.convert.settings import Settings
        from moepack.convert.source import BLOB_FILES
    except ImportError as e:
        return None, f"layout planner not available ({e})"
    files = [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in listing.files
             if f.name.endswith(".safetensors")]
    blobs = {f.name: f.size for f in listing.files if f.name in BLOB_FILES}
    names, note = None, ""
    if _declares_mtp(config):
        try:
            names = _tensor_names(listing, dest)
        except (ValueError, OSError, httpx2.HTTPError, ConvertError) as e:
            return None, f"{INDEX} unreadable: {e}"
        if names is None:
            note = "; its multi-token-prediction layers assumed present (no safetensors index)"
    try:   # bounds and engine rules first (plan.described): a hostile config allocates nothing
        layout = plan_for_config(config, Settings(), files=files, blobs=blobs, names=names)
    except (ConvertError, ValueError) as e:  # refusals (FormatError, ModelDescError: ValueError);
        return None, f"planner: {e}"          # anything else is a bug and is raised
    return int(layout.file_size), ("exact: config.json through the layout planner, default "
                                   f"settings{note}")
