"""moepack/untrusted_json.py: the one bounded loader for untrusted JSON (issue 13). Every failure
is one error of the caller's class whose message starts with what was read; depth is measured
before parsing (no RecursionError), and brackets inside strings do not count."""

from __future__ import annotations

import json
import os

import pytest

from moepack.untrusted_json import json_depth, loads


class Boom(ValueError):
    pass


@pytest.mark.parametrize(("data", "depth"), [
    (b"{}", 1), (b"[[[]]]", 3), (b'["[[[[", "]"]', 1), (b'["\\"[[["]', 1),
    (b'["\\\\", [[]]]', 3), (b'{"a": "\\\\\\"[[", "b": [{}]}', 3), (b"1", 0),
])
def test_depth_ignores_brackets_inside_strings(data: bytes, depth: int) -> None:
    assert json_depth(data, 64) == depth


def test_depth_across_chunk_boundaries() -> None:
    """The scan works in 4 MiB chunks: a string or a backslash run spanning a boundary."""
    pad = 1 << 22
    data = b'["' + b"\\" * (pad - 2) + b'", [[[]]]]'   # an even run of backslashes crossing
    assert json.loads(data) and json_depth(data, 64) == 4
    data = b'["' + b"x" * (pad - 3) + b'[[[[[", []]'     # brackets in a string crossing
    assert json_depth(data, 64) == 2


@pytest.mark.parametrize(("data", "message"), [
    (b"[" * 200_000 + b"]" * 200_000, "thing: JSON nested deeper than 16 levels"),
    (b"[" * 17 + b"]" * 17, "thing: JSON nested deeper than 16 levels"),
    (b'{"a": "\xff"}', "thing: not UTF-8 (invalid start byte at byte 7)"),
    (b"{not json", "thing: not valid JSON (Expecting property name"),
    (b"x" * 101, "thing: 101 bytes of JSON, more than the 100 allowed"),
])
def test_one_error_of_the_callers_class(data: bytes, message: str) -> None:
    with pytest.raises(Boom) as e:
        loads(data, "thing", max_bytes=100 if len(data) == 101 else 1 << 22, max_depth=16,
              error=Boom)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_within_bounds_parses() -> None:
    doc = {"files": [{"name": "a[", "size": 1}]}
    assert loads(json.dumps(doc).encode(), "x", max_bytes=1000, max_depth=3) == doc


def test_every_untrusted_parser_uses_it(tmp_path) -> None:
    """convert (config, header, index), fetch (hub listing, state), verify (expectations), the
    tokenizer config and convert's reuse of fetch's manifest: deep nesting is their own error."""
    from moepack.convert.errors import SourceError
    from moepack.convert.fingerprint import _fetch_hashes
    from moepack.convert.st_header import parse_json
    from moepack.fetch.errors import FetchError
    from moepack.fetch.hub_listing import parse_tree
    from moepack.runtime.tokenizer import TokenizerError, _parse_config
    from moepack.verify.expect import ExpectError, load_expectations

    deep = b"[" * 100_000
    with pytest.raises(SourceError, match="nested deeper"):
        parse_json(deep, "config.json")
    with pytest.raises(FetchError, match="nested deeper"):
        parse_tree(deep, "o/r")
    with pytest.raises(TokenizerError, match="nested deeper"):
        _parse_config(deep, "m.moepack")
    (tmp_path / "moepack-source.json").write_bytes(deep)
    with pytest.raises(ExpectError, match="nested deeper"):
        load_expectations(tmp_path / "moepack-source.json")
    assert _fetch_hashes(tmp_path) == {}          # only a cache: ignored, no RecursionError
    os.unlink(tmp_path / "moepack-source.json")
    os.mkfifo(tmp_path / "moepack-source.json")   # never waited on
    assert _fetch_hashes(tmp_path) == {}
