"""Hostile input: mutated valid vectors must be rejected with FormatError or, if accepted, every
tensor, record, hash and blob must read without any other exception.

Bounded for `make test`; `make fuzz` sets MOEPACK_FUZZ_EXAMPLES for a long randomised run.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moepack.format import Container, FormatError
from spec_vectors import VALID, load_generator

from moepack.safefs import name_problem

EXAMPLES = int(os.environ.get("MOEPACK_FUZZ_EXAMPLES", "100"))
LONG = "MOEPACK_FUZZ_EXAMPLES" in os.environ
gen = load_generator()
BASES = {p.stem: p.read_bytes() for p in VALID}  # drawn by name: short failure reports
bases = st.sampled_from(sorted(BASES))
WORKDIR = Path(tempfile.mkdtemp(prefix="moepack-fuzz-"))  # one file, rewritten per example
atexit.register(shutil.rmtree, WORKDIR, True)

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=list(HealthCheck))

FIELD_BITS = {"major": 16, "minor": 16, "flags": 32, "alignment": 32, "header_size": 32}
# Values that stress bounds: edges of the spec's limits and of 32/64-bit arithmetic.
EDGE_INTS = [0, 1, 2, 63, 64, 65, 511, 512, 4096, 1 << 31, (1 << 31) - 1, 1 << 32, 1 << 40,
             (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, -1, -(1 << 63)]
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(1 << 66), 1 << 66))
json_values = st.one_of(ints, st.none(), st.booleans(), st.floats(allow_nan=False,
                        allow_infinity=False), st.text(max_size=8), st.just([]), st.just({}),
                        st.lists(ints, max_size=5))


def read_everything(c: Container) -> None:
    for s in c.sections:
        if s["type"] == "tensor":
            c.tensor(s["name"])
        elif s["type"] == "blob":
            c.blob(s["name"])
    for b in c.banks():
        for e in range(b["count"]):
            c.expert_record(b["layer"], e)
            c.expert_hash(b["layer"], e)
            for p in b["parts"]:
                c.expert_part(b["layer"], e, p["name"])


def check(data: bytes) -> None:
    path = WORKDIR / "fuzz.moepack"
    path.write_bytes(data)
    try:
        with Container.open(path) as c:
            read_everything(c)
    except FormatError:
        pass


@FUZZ
@given(name=bases, flips=st.lists(
    st.tuples(st.sampled_from(["header", "index", "anywhere"]), st.integers(0, 1 << 30),
              st.integers(0, 7)), min_size=1, max_size=8))
def test_bit_flips(name: str, flips: list[tuple[str, int, int]]) -> None:
    base = BASES[name]
    data = bytearray(base)
    h = gen.header_fields(base)
    for region, pos, bit in flips:
        lo, hi = {"header": (0, 128), "index": (h["index_offset"], len(data)),
                  "anywhere": (0, len(data))}[region]
        data[lo + pos % (hi - lo)] ^= 1 << bit
    check(bytes(data))


@FUZZ
@given(name=bases, cut=st.integers(0, 1 << 30), from_end=st.booleans())
def test_truncations(name: str, cut: int, from_end: bool) -> None:
    base = BASES[name]
    n = cut % (len(base) + 1)
    check(base[: len(base) - n] if from_end else base[:n])


@FUZZ
@given(name=bases, field=st.sampled_from(
    ["major", "minor", "flags", "alignment", "header_size", "file_size", "index_offset",
     "index_length"]), value=st.one_of(st.sampled_from(EDGE_INTS), st.integers(0, 1 << 64)),
       fix_hash=st.booleans())
def test_header_rewrites(name: str, field: str, value: int, fix_hash: bool) -> None:
    base = BASES[name]
    bits = FIELD_BITS.get(field, 64)
    check(gen.patch_header(base, fix_hash=fix_hash, **{field: value % (1 << bits)}))


def _targets(doc: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every (object, key) inside the sections, parts included."""
    out = []
    for s in doc["sections"]:
        if not isinstance(s, dict):
            continue
        out += [(s, k) for k in s]
        parts = s.get("parts")
        for p in parts if isinstance(parts, list) else []:
            out += [(p, k) for k in p] if isinstance(p, dict) else []
    return out


@FUZZ
@given(name=bases, edits=st.lists(st.tuples(
    st.integers(0, 1 << 20), st.sampled_from(["set", "delete", "inflate"]), json_values),
    min_size=1, max_size=4), data=st.data())
def test_index_rewrites(name: str, edits: list, data: st.DataObject) -> None:
    """Resealed index edits (root and header hashes fixed) reach the deep section checks."""
    base = BASES[name]
    doc = gen.index_doc(base)
    for pick, action, value in edits:
        targets = _targets(doc)
        obj, key = targets[pick % len(targets)]
        if action == "delete":
            del obj[key]
        elif action == "inflate" and isinstance(obj[key], int):
            obj[key] = obj[key] * data.draw(st.sampled_from([2, 4096, 1 << 32])) + data.draw(
                st.sampled_from([0, 1, 64, -64]))
        else:
            obj[key] = value
    try:
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    except ValueError:
        return
    check(gen.reseal(base, raw))


@FUZZ
@given(name=bases, i=st.integers(0, 1000), j=st.integers(0, 1000),
       dup=st.booleans())
def test_section_reorders(name: str, i: int, j: int, dup: bool) -> None:
    base = BASES[name]
    doc = gen.index_doc(base)
    s = doc["sections"]
    a, b = i % len(s), j % len(s)
    if dup:
        s.insert(b, dict(s[a]))
    else:
        s[a], s[b] = s[b], s[a]
    check(gen.reseal(base, doc))


WITH_BLOBS = sorted(n for n, d in BASES.items()
                    if any(s["type"] == "blob" for s in gen.index_doc(d)["sections"]))
# Names a hostile container could give a blob (export writes OUTDIR/NAME): paths, dots, controls.
blob_names = st.one_of(
    st.sampled_from(["..", ".", "", "/etc/passwd", "../x", "a/b", "a\\b", "x" * 255, "x" * 256,
                     "\x00", "a\x1bb", "a\u202eb", "...", ".hidden"]),
    st.text(alphabet="./\\ax\x00\x1b\x7f", max_size=8), st.text(max_size=300))


@FUZZ
@given(name=st.sampled_from(WITH_BLOBS), pick=st.integers(0, 100), new=blob_names)
def test_blob_names(name: str, pick: int, new: str) -> None:
    """A renamed blob, resealed: refused, or its name is a single plain file name."""
    base = BASES[name]
    doc = gen.index_doc(base)
    blobs = [s for s in doc["sections"] if s["type"] == "blob"]
    blobs[pick % len(blobs)]["name"] = new
    path = WORKDIR / "fuzz.moepack"
    path.write_bytes(gen.reseal(base, doc))
    try:
        with Container.open(path) as c:
            assert all(name_problem(b) is None for b in c.blob_names()), c.blob_names()
            read_everything(c)
    except FormatError:
        pass
