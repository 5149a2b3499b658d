"""JSON from a hub or a local state file, parsed with bounds: size and nesting depth are checked
before the parser runs, so hostile input cannot recurse the parser or exhaust memory."""

from __future__ import annotations

import json
import re

from moepack.fetch.errors import FetchError

MAX_DEPTH = 16          # a hub tree entry is 3 deep; state files 2
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


def depth_exceeds(text: str, limit: int) -> bool:
    """True when brackets outside strings nest deeper than `limit` (linear, no recursion)."""
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > limit:
            return True
    return False


def loads(data: bytes, what: str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> object:
    """Parsed JSON, or one FetchError starting with `what` (too large, too deep, invalid)."""
    if len(data) > max_bytes:
        raise FetchError(f"{what}: {len(data)} bytes of JSON, more than the {max_bytes} allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FetchError(f"{what}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if depth_exceeds(text, max_depth):
        raise FetchError(f"{what}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise FetchError(f"{what}: not valid JSON ({str(e)[:120]})") from None
