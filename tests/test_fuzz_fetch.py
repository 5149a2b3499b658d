"""Fuzz of fetch's untrusted parsers: hub tree listings and torrent metadata (magnets too).
Garbage must end in FetchError and nothing else; what is accepted must be safe to use (plain
name components, sizes in range, one file).

Bounded for `make test`; MOEPACK_FUZZ_EXAMPLES (set by `make fuzz`) scales it, as in
tests/test_fuzz.py.
"""

from __future__ import annotations

import json
import os

import libtorrent as lt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moepack.fetch.errors import FetchError
from moepack.fetch.hub_listing import MAX_FILE_BYTES, parse_tree
from moepack.fetch.torrent_source import describe, load_params, parse_torrent

from moepack.safefs import name_problem

EXAMPLES = int(os.environ.get("MOEPACK_FUZZ_EXAMPLES", "150"))
LONG = "MOEPACK_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=list(HealthCheck))

OID, SHA = "a" * 40, "b" * 64
names = st.one_of(st.sampled_from([".", "..", "", "/", "a/b", "a//b", "/abs", "a/../b", "x\\y",
                                   "\x1b[31m", "ok.bin", ".moepack-partial/x", "a.incomplete"]),
                  st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                    st.floats(allow_nan=False), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12)


@st.composite
def tree_entries(draw: st.DrawFn) -> object:
    """Mostly well-formed entries with one field at a time bent out of shape."""
    e: dict[str, object] = {"type": draw(st.sampled_from(["file", "directory", "x"])),
                            "path": draw(names), "size": draw(st.integers(-5, 1 << 50)),
                            "oid": draw(st.sampled_from([OID, "zz", SHA]))}
    if draw(st.booleans()):
        e["lfs"] = {"oid": draw(st.sampled_from([SHA, SHA.upper(), "q"])),
                    "size": e["size"]}
    if draw(st.booleans()):
        e[draw(st.sampled_from(["type", "path", "size", "oid", "lfs"]))] = draw(values)
    return e


def check_tree(body: bytes) -> None:
    try:
        files = parse_tree(body, "org/fuzz")
    except FetchError:
        return
    seen = set()
    for f in files:
        assert all(name_problem(p) is None for p in f.name.split("/")), f.name
        assert 0 <= f.size <= MAX_FILE_BYTES and f.name not in seen
        seen.add(f.name)


@FUZZ
@given(st.lists(tree_entries(), max_size=6))
def test_tree_listing_entries(entries: list) -> None:
    check_tree(json.dumps(entries).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=200), values.map(lambda v: json.dumps(v).encode()),
                 st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)))
def test_tree_listing_garbage(body: bytes) -> None:
    check_tree(body)


def _torrent(info: dict) -> bytes:
    return lt.bencode({b"info": info})


GOOD = _torrent({b"name": b"m.moepack", b"length": 100_000, b"piece length": 16384,
                 b"pieces": b"\x01" * 20 * 7, b"moepack id": b"c" * 64})


def check_torrent(data: bytes) -> None:
    try:
        meta = describe(parse_torrent(data, "fuzz.torrent").ti, "fuzz.torrent")
    except FetchError:
        return
    assert name_problem(meta.name) is None and not meta.name.startswith("."), meta.name
    assert meta.size >= 0 and meta.ti.num_files() == 1


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1,
                max_size=6))
def test_torrent_byte_mutations(edits: list[tuple[int, int]]) -> None:
    data = bytearray(GOOD)
    for pos, byte in edits:
        data[pos] = byte
    check_torrent(bytes(data))


bvalues = st.recursive(st.one_of(st.integers(-(1 << 40), 1 << 40), st.binary(max_size=12)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.binary(max_size=6), inner,
                                                               max_size=3)), max_leaves=10)


@FUZZ
@given(name=st.one_of(st.binary(max_size=20), st.sampled_from([b".", b"..", b".x", b"a/b",
                                                              b"\x1b[2J", b"\xff"])),
       extra=st.dictionaries(st.sampled_from([b"length", b"piece length", b"pieces", b"files",
                                              b"moepack id", b"name.utf-8"]), bvalues,
                             max_size=3),
       comment=st.binary(max_size=20))
def test_torrent_info_dicts(name: bytes, extra: dict, comment: bytes) -> None:
    info = {b"name": name, b"length": 100_000, b"piece length": 16384,
            b"pieces": b"\x01" * 20 * 7, **extra}
    check_torrent(lt.bencode({b"comment": comment, b"info": info}))
    check_torrent(_torrent(info))


@FUZZ
@given(st.text(max_size=120).map(lambda s: "magnet:?" + s))
def test_magnet_links(uri: str) -> None:
    try:
        load_params(uri)
    except FetchError:
        pass
