"""The one bounded JSON loader for untrusted input: hub listings and fetch state, config.json,
safetensors headers and index files, tokenizer configs from a container, verify's expectation
files. Size and nesting depth are checked before the parser runs, so hostile input can neither
recurse the parser (RecursionError, a traceback) nor exhaust memory; every failure is one
message that starts with what was being read. The container index's canonical parser
(format/canonical.py) shares the depth scan.
"""

from __future__ import annotations

import json

import numpy as np

MAX_DEPTH = 64         # FORMAT.md section 3 (format.limits.MAX_JSON_DEPTH); callers may ask less
_CHUNK = 1 << 22


def _real_quotes(a: np.ndarray, run: int) -> tuple[np.ndarray, int]:
    """Quotes not escaped by an odd run of backslashes; `run` carries a run across chunks."""
    quote = a == 0x22
    bs = a == 0x5C
    if run == 0 and not bs.any():
        return quote, 0
    idx = np.arange(a.size, dtype=np.int32)
    last_other = np.maximum.accumulate(np.where(bs, np.int32(-1), idx))
    runs = idx - last_other + np.where(last_other < 0, np.int32(run), np.int32(0))
    before = np.concatenate((np.array([run], np.int32), runs[:-1]))
    return quote & (before % 2 == 0), int(runs[-1])


def json_depth(data: bytes, limit: int = MAX_DEPTH) -> int:
    """Deepest bracket nesting outside strings (stops early once past `limit`).

    Linear time, bounded memory, no recursion: run before parsing so no parser recurses on
    hostile input.
    """
    inside, run, depth, deepest = 0, 0, 0, 0
    for start in range(0, len(data), _CHUNK):
        a = np.frombuffer(data, np.uint8, min(_CHUNK, len(data) - start), start)
        quote, run = _real_quotes(a, run)
        outside = (np.cumsum(quote, dtype=np.int32) + inside) % 2 == 0
        delta = (outside & ((a == 0x5B) | (a == 0x7B))).view(np.int8)
        delta = delta - (outside & ((a == 0x5D) | (a == 0x7D))).view(np.int8)
        level = np.cumsum(delta, dtype=np.int32) + depth
        deepest = max(deepest, int(level.max()))
        if deepest > limit:
            break
        inside, depth = int(not outside[-1]), int(level[-1])
    return deepest


def loads(data: bytes, what: str, *, max_bytes: int, max_depth: int = MAX_DEPTH,
          error: type[Exception] = ValueError) -> object:
    """Parsed JSON, or one `error` whose message starts with `what`: too large, not UTF-8,
    nested deeper than `max_depth`, or not valid JSON."""
    if len(data) > max_bytes:
        raise error(f"{what}: {len(data):,} bytes of JSON, more than the {max_bytes:,} allowed")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if json_depth(data, max_depth) > max_depth:
        raise error(f"{what}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise error(f"{what}: not valid JSON ({str(e)[:120]})") from None
