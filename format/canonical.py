"""Canonical JSON (FORMAT.md section 3): one encoder for writers, a strict parser for readers."""

from __future__ import annotations

import json
import math
from typing import Any

from moepack.format.errors import FormatError, reject
from moepack.format.limits import MAX_JSON_DEPTH

from moepack.untrusted_json import json_depth

INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
# A number too large for binary64 (1e999): no float is written back as that text (FORMAT.md §3,
# §11 step 20); runtime/src/json.c says the same.
OVERFLOW = "a number overflows binary64"


def canonical_json(obj: Any) -> bytes:
    """The canonical encoding: sorted keys, no whitespace, raw UTF-8, Python float repr."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FormatError(f"duplicate key {key!r}", "duplicate_key")
        out[key] = value
    return out


def _parse_int(text: str) -> int:
    if len(text) > 20:  # longer than any int64; refused before Python builds a huge integer
        raise FormatError(f"integer out of range: {text[:24]}... (JSON integers must fit int64)",
                          "integer_range")
    return int(text)


def _no_constant(name: str) -> Any:
    raise FormatError(f"forbidden constant {name}", "forbidden_constant")


def _check_numbers(obj: Any, field: str, offset: int | None, finite: bool) -> None:
    """Every integer must fit a signed 64-bit value, so C readers parse the same documents; with
    `finite`, every float must be finite (canonical JSON has no NaN or Infinity)."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, int) and not isinstance(x, bool) and not INT_MIN <= x <= INT_MAX:
            raise reject("integer_range", field,
                         f"integer out of range: {x} (JSON integers must fit int64)", offset)
        elif finite and isinstance(x, float) and not math.isfinite(x):
            raise reject("forbidden_constant", field,
                         f"forbidden constant {x} (canonical JSON has no NaN or Infinity)", offset)


def check_writable(obj: Any, field: str) -> None:
    """FormatError (naming `field`) for a number canonical JSON cannot hold. Anything that is not
    a JSON value at all is the caller's bug: canonical_json raises TypeError for it."""
    _check_numbers(obj, field, None, finite=True)


def parse_canonical(data: bytes, field: str, offset: int | None = None) -> Any:
    """Parse `data` as canonical JSON; errors name `field` and the file `offset` of `data`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise reject("invalid_utf8", field, f"invalid UTF-8 at byte {e.start}", offset) from None
    depth = json_depth(data, MAX_JSON_DEPTH)  # before parsing: no parser recursion
    if depth > MAX_JSON_DEPTH:
        raise reject("json_depth", field, f"JSON nesting depth {depth} exceeds {MAX_JSON_DEPTH}",
                     offset)
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                         parse_int=_parse_int)
    except FormatError as e:
        kind = "" if e.code == "integer_range" else "bad JSON: "
        raise reject(e.code, field, f"{kind}{e}", offset) from None
    except json.JSONDecodeError as e:  # the detail is CPython's wording; only the code is stable
        raise reject("json_syntax", field, f"bad JSON: {e}", offset) from None
    _check_numbers(obj, field, offset, finite=False)  # 1e400: not_canonical below
    try:
        again = json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except ValueError:  # 1e400 parsed as infinity (NaN and Infinity were refused above)
        raise reject("not_canonical", field, f"not canonical JSON: {OVERFLOW}", offset) from None
    if again != text:
        pairs = enumerate(zip(again, text, strict=False))
        at = next((i for i, (a, b) in pairs if a != b), min(len(again), len(text)))
        raise reject("not_canonical", field,
                     f"not canonical JSON (first difference at character {at})", offset)
    return obj
