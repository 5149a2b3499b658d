"""verify() against spec/vectors: valid files pass; no invalid file passes.

An invalid vector is either not verifiable (exit 2, with the reader's message) or, when the
file is still recognisable, reported as damage of the item that breaks it (docs/VERIFY.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moepack.format import Container
from moepack.verify import verify
from spec_vectors import INVALID, VALID, VECTORS

# Invalid vectors that verify classifies as damage (exit 1) rather than "not verifiable".
AS_DAMAGE = {
    "bad_header_hash": "header",
    "header_padding": "padding",
    "wrong_root_hash": "index",
}


@pytest.mark.skipif(not VALID, reason="spec/vectors/valid not generated")
@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vectors_are_intact(path: Path) -> None:
    r = verify(path)
    assert r.exit_code == 0, (r.error, r.damaged)


@pytest.mark.skipif(not INVALID, reason="spec/vectors/invalid not generated")
@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_vectors_never_pass(path: Path) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    r = verify(path)
    if path.stem in AS_DAMAGE:
        assert r.exit_code == 1
        assert [d.name for d in r.damaged] == [AS_DAMAGE[path.stem]]
    else:
        assert r.exit_code == 2
        assert expected["error"] in (r.error or ""), r.error
        assert r.error_code == expected["code"], (r.error, r.error_code)


FUTURE_MINOR = VECTORS / "valid" / "future_minor.moepack"
KNOWN = ("tensor", "blob", "expert_hashes", "expert_bank")


@pytest.mark.skipif(not FUTURE_MINOR.exists(), reason="spec/vectors/valid not generated")
def test_unknown_section_type_is_still_hashed(tmp_path: Path) -> None:
    """A section type from a newer minor is checked by its common `hash` (FORMAT.md 4.5)."""
    path = tmp_path / "f.moepack"
    path.write_bytes(FUTURE_MINOR.read_bytes())
    with Container.open(path) as c:
        (s,) = [s for s in c.sections if s["type"] not in KNOWN]
    data = bytearray(path.read_bytes())
    data[s["offset"] + s["length"] // 2] ^= 0x10
    path.write_bytes(data)
    (d,) = verify(path).damaged
    assert (d.kind, d.label, d.offset, d.length) == ("section", f"section {s['name']}",
                                                     s["offset"], s["length"])
