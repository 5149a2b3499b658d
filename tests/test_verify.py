"""moepack.verify.verify: one flipped byte in each kind of region -> exactly that item reported."""

from __future__ import annotations

import shutil
from pathlib import Path

import blake3
import pytest
from damage import flip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moepack.format import Container
from moepack.format.errors import CODES
from moepack.format.header import Header, parse_header
from moepack.format.synthetic import mixtral_spec, write_synthetic
from moepack.verify import verify

TOKENIZER = "tokenizer.json"
TOKENIZER_BYTES = b'{"model": {"type": "BPE"}, "synthetic": true}'  # 45 bytes: a gap follows


def build(path: Path) -> None:
    n = len(TOKENIZER_BYTES)
    spec = mixtral_spec(inter=40, blobs={TOKENIZER: (n, "none", n)})  # records end in padding
    write_synthetic(path, spec, {TOKENIZER: TOKENIZER_BYTES})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify") / "tiny.moepack"
    build(path)
    return path


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.moepack"
    shutil.copyfile(pristine, dst)
    return dst


def offsets(path: Path) -> dict[str, int]:
    """A byte inside each kind of region of the synthetic container."""
    with Container.open(path) as c:
        by = {s["name"]: s for s in c.sections}
        blob_end = by[TOKENIZER]["offset"] + by[TOKENIZER]["length"]
        tables_end = by["expert_hashes.1"]["offset"] + by["expert_hashes.1"]["length"]
        assert by["expert_hashes.0"]["offset"] > blob_end  # the synthetic layout has these gaps
        assert by["experts.0"]["offset"] > tables_end
        rec, stride = c.expert_range(0, 3)
        assert c.bank(0)["record_length"] < stride  # records end in zero padding
        return {
            "expert": c.expert_range(1, 2)[0] + 100,
            "record_padding": rec + stride - 1,
            "trunk": by["layers.0.attn.q"]["offset"] + 5,
            "codebook": by["layers.1.experts.gate.codebook"]["offset"] + 1000,
            "blob": by[TOKENIZER]["offset"] + 3,
            "table": by["expert_hashes.0"]["offset"] + 32 * 3 + 7,
            "index": c.header.index_offset + c.header.index_length // 2,
            "gap": blob_end,
            "gap_before_bank": tables_end + 10,
            "header_padding": 500,
        }


EXPECTED = {
    "expert": ("expert", "layer 1 expert 2"),
    "record_padding": ("expert", "layer 0 expert 3"),  # inside the record: covered by its hash
    "trunk": ("tensor", "layers.0.attn.q"),
    "codebook": ("tensor", "layers.1.experts.gate.codebook"),
    "blob": ("blob", "tokenizer.json"),
    "table": ("expert_hashes", "expert_hashes.0"),
    "index": ("index", "index"),
    "gap": ("padding", "padding"),
    "gap_before_bank": ("padding", "padding"),
    "header_padding": ("padding", "padding"),
}

# The stable code of each finding (FORMAT.md §11.1): bytes that fail their BLAKE3 are
# content_hash, the header's and index's own hashes have their open-time codes.
EXPECTED_CODE = {
    "expert": "content_hash",
    "record_padding": "content_hash",
    "trunk": "content_hash",
    "codebook": "content_hash",
    "blob": "content_hash",
    "table": "content_hash",
    "index": "index_hash_mismatch",
    "gap": "invalid",
    "gap_before_bank": "invalid",
    "header_padding": "header_padding",
}


def test_intact(pristine: Path) -> None:
    r = verify(pristine)
    assert r.ok and r.exit_code == 0 and not r.damaged
    with Container.open(pristine) as c:
        assert r.container_id == c.id
        assert r.bytes_checked == c.file_size  # every byte of the file was looked at
        sections = sum(1 for s in c.sections if s["type"] != "expert_bank")
        records = sum(b["count"] for b in c.banks())
    assert records == 8 and r.items_checked == 2 + sections + records  # + header, index


@pytest.mark.parametrize("region", sorted(EXPECTED))
def test_one_flip_reports_exactly_that_item(copy: Path, region: str) -> None:
    at = offsets(copy)[region]
    flip(copy, at)
    r = verify(copy)
    assert r.exit_code == 1 and r.error is None
    assert [(d.kind, d.name) for d in r.damaged] == [EXPECTED[region]]
    d = r.damaged[0]
    assert d.offset <= at < d.offset + d.length
    assert d.code == EXPECTED_CODE[region] and d.to_dict()["code"] == d.code
    assert d.code in CODES


def test_padding_range_is_the_nonzero_bytes(copy: Path) -> None:
    at = offsets(copy)["header_padding"]
    flip(copy, at)
    flip(copy, at + 3)
    (d,) = verify(copy).damaged
    assert (d.offset, d.length) == (at, 4)
    assert d.label == "padding"


@pytest.mark.parametrize("region", ["gap", "gap_before_bank"])
def test_nonzero_gap_is_invalid_in_the_spec_s_words(copy: Path, region: str) -> None:
    """FORMAT.md §11 (checks made later): no open-time rule reads a gap, so `invalid`."""
    flip(copy, offsets(copy)[region])
    (d,) = verify(copy).damaged
    assert d.code == "invalid" and d.detail.startswith("non-zero bytes in the gap ")


def test_labels(copy: Path) -> None:
    o = offsets(copy)
    for region in ("expert", "trunk", "blob", "table"):
        flip(copy, o[region])
    labels = [d.label for d in verify(copy).damaged]
    assert labels == ["tensor layers.0.attn.q", "blob tokenizer.json", "expert_hashes.0",
                      "layer 1 expert 2"]


def test_damaged_table_alone_clears_its_records(copy: Path) -> None:
    flip(copy, offsets(copy)["table"])
    r = verify(copy)
    assert [d.name for d in r.damaged] == ["expert_hashes.0"]
    assert any("all 4 records match" in n for n in r.notes)


def test_damaged_table_and_record(copy: Path) -> None:
    with Container.open(copy) as c:
        rec = c.expert_range(0, 1)[0]
    flip(copy, offsets(copy)["table"])  # entry 3
    flip(copy, rec + 9)
    names = [(d.name, d.detail) for d in verify(copy).damaged]
    assert names[0][0] == "expert_hashes.0"
    # Against a damaged table, both the damaged record and the damaged entry disagree.
    assert [n for n, _ in names[1:]] == ["layer 0 expert 1", "layer 0 expert 3"]
    assert all("damaged hash table" in d for _, d in names[1:])
    assert {d.code for d in verify(copy).damaged} == {"content_hash"}


@pytest.mark.parametrize("at", [12, 50, 85, 100, 127])  # flags, root hash, reserved, header hash
def test_header_flip_is_header_damage(copy: Path, at: int) -> None:
    flip(copy, at, 0x01)
    r = verify(copy)
    assert r.exit_code == 1
    assert [d.name for d in r.damaged] == ["header"]
    assert (r.damaged[0].offset, r.damaged[0].length) == (0, 128)
    assert r.damaged[0].code == "header_hash_mismatch"


def test_header_flip_in_root_hash_still_checks_items(copy: Path) -> None:
    o = offsets(copy)
    flip(copy, 50)
    flip(copy, o["expert"])
    r = verify(copy)
    assert [d.name for d in r.damaged] == ["header", "layer 1 expert 2"]
    assert any("unauthenticated" in n for n in r.notes)
    assert r.container_id is None  # neither the damaged header nor the index can vouch


def test_header_flip_outside_root_hash_keeps_the_id(copy: Path, pristine: Path) -> None:
    flip(copy, 100)
    with Container.open(pristine) as c:
        assert verify(copy).container_id == c.id


def test_header_flip_in_index_offset_stops_item_checks(copy: Path) -> None:
    flip(copy, 33)
    r = verify(copy)
    assert [d.name for d in r.damaged] == ["header"]
    assert any("does not locate the index" in n for n in r.notes)


def test_damaged_index_checks_no_items(copy: Path) -> None:
    o = offsets(copy)
    flip(copy, o["index"])
    flip(copy, o["expert"])  # cannot be judged without a trusted index
    r = verify(copy)
    assert [d.name for d in r.damaged] == ["index"]
    assert r.container_id is not None  # the ID from the intact header: what to re-fetch


def test_quick_checks_header_and_index_only(copy: Path) -> None:
    o = offsets(copy)
    flip(copy, o["expert"])
    r = verify(copy, quick=True)
    assert r.ok and r.quick and r.items_checked == 2
    flip(copy, o["index"])
    assert [d.name for d in verify(copy, quick=True).damaged] == ["index"]


def test_quick_applies_the_readers_header_padding_rule(copy: Path) -> None:
    flip(copy, 200, 0x01)   # inside [128, alignment): the reader refuses the file at open
    with pytest.raises(Exception, match="header padding"):
        Container.open(copy).close()
    for quick in (True, False):
        r = verify(copy, quick=quick)
        assert not r.ok
        assert [(d.kind, d.offset, d.length, d.code) for d in r.damaged] == [
            ("padding", 200, 1, "header_padding")]


@pytest.mark.parametrize("io", ["direct", "buffered"])
def test_io_modes_agree(copy: Path, io: str) -> None:
    flip(copy, offsets(copy)["codebook"])
    r = verify(copy, io=io, threads=2)  # type: ignore[arg-type]
    assert [d.name for d in r.damaged] == ["layers.1.experts.gate.codebook"]


# --- not verifiable (exit 2) -------------------------------------------------------------------

def _rewrite_header(path: Path, **changes: int) -> None:
    h = parse_header(path.read_bytes()[:128], path.stat().st_size)
    fields = {k: getattr(h, k) for k in ("major", "minor", "flags", "alignment", "file_size",
                                         "index_offset", "index_length", "root_hash")}
    fields.update(changes)
    with open(path, "r+b") as f:
        f.write(Header(**fields).pack())


def _expect_error(path: Path, text: str) -> None:
    r = verify(path)
    assert r.exit_code == 2 and not r.ok
    assert r.error is not None and text in r.error, r.error


def test_truncated(copy: Path) -> None:
    size = copy.stat().st_size
    with open(copy, "r+b") as f:
        f.truncate(size // 2)
    _expect_error(copy, "truncated")


def test_truncated_or_appended_copy_reports_the_claimed_id(copy: Path, pristine: Path) -> None:
    cid = verify(pristine).container_id
    with open(copy, "ab") as f:
        f.write(b"\x01" * 100)
    r = verify(copy)
    assert r.exit_code == 2 and r.container_id is None
    assert r.to_dict()["claimed_container_id"] == cid
    with open(copy, "r+b") as f:
        f.truncate(1000)
    assert verify(copy).claimed_container_id == cid
    flip(copy, 40)   # inside the hashed header: it no longer vouches for anything
    assert verify(copy).claimed_container_id is None


def test_shorter_than_header(copy: Path) -> None:
    with open(copy, "r+b") as f:
        f.truncate(100)
    _expect_error(copy, "truncated")


def test_unfinished_conversion(copy: Path) -> None:
    with open(copy, "r+b") as f:
        f.write(bytes(128))
    _expect_error(copy, "unfinished conversion")


def test_wrong_magic(copy: Path) -> None:
    flip(copy, 0, 0x20)
    _expect_error(copy, "not a moepack file")


def test_future_major(copy: Path) -> None:
    _rewrite_header(copy, major=2)
    _expect_error(copy, "unsupported major version 2")


def test_authenticated_but_invalid_index(copy: Path) -> None:
    with Container.open(copy) as c:
        off, n = c.header.index_offset, c.header.index_length
    data = bytearray(copy.read_bytes()[off:off + n])
    data[2:10] = b"manifesX"  # '{"manifest":...' -> the key is gone, the JSON still parses
    with open(copy, "r+b") as f:
        f.seek(off)
        f.write(data)
    _rewrite_header(copy, root_hash=blake3.blake3(bytes(data)).digest())
    _expect_error(copy, "missing key 'manifest'")


def test_not_a_file(tmp_path: Path) -> None:
    _expect_error(tmp_path, "not a regular file")
    _expect_error(tmp_path / "absent.moepack", "cannot open")


def test_empty_and_garbage(tmp_path: Path) -> None:
    p = tmp_path / "x.moepack"
    p.write_bytes(b"")
    _expect_error(p, "truncated")
    p.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    _expect_error(p, "not a moepack file")


# --- any single flipped byte -------------------------------------------------------------------

@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_flip_is_found_where_it_is(pristine: Path, tmp_path: Path, data: st.DataObject) -> None:
    size = pristine.stat().st_size
    at = data.draw(st.integers(0, size - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="mask")
    path = tmp_path / "fuzz.moepack"
    shutil.copyfile(pristine, path)
    flip(path, at, mask)
    r = verify(path)
    if at < 10:  # magic and major are checked before the header hash (spec order)
        assert r.exit_code == 2
        return
    assert r.exit_code == 1, (at, r.error)
    assert len(r.damaged) == 1
    d = r.damaged[0]
    assert d.offset <= at < d.offset + d.length, (at, d)


def test_nonzero_record_padding_under_a_matching_hash(copy: Path) -> None:
    """A writer that hashed non-zero record padding: intact as written, but not conforming."""
    with Container.open(copy) as c:
        rec, stride = c.expert_range(0, 1)
        table = next(s for s in c.sections if s["name"] == "expert_hashes.0")
        h = c.header
    data = bytearray(copy.read_bytes())
    data[rec + stride - 1] = 7  # after record_length: must be zero
    data[table["offset"] + 32:table["offset"] + 64] = blake3.blake3(data[rec:rec + stride]).digest()
    new_table_hash = blake3.blake3(data[table["offset"]:table["offset"] + table["length"]])
    index = bytes(data[h.index_offset:]).replace(table["hash"].encode(),
                                                 new_table_hash.hexdigest().encode())
    data[h.index_offset:] = index
    copy.write_bytes(data)
    _rewrite_header(copy, root_hash=blake3.blake3(index).digest())
    r = verify(copy)
    assert [(d.kind, d.offset, d.length) for d in r.damaged] == [("padding", rec + stride - 1, 1)]
    assert r.damaged[0].code == "invalid"
    assert r.damaged[0].detail == "non-zero record padding in layer 0 expert 1"
    assert "layer 0 expert 1" in r.damaged[0].detail


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_truncation_or_smear_is_never_intact(pristine: Path, tmp_path: Path,
                                                 data: st.DataObject) -> None:
    """Truncations and runs of garbage: always a report (exit 1 or 2), never an exception."""
    raw = bytearray(pristine.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[:data.draw(st.integers(0, len(raw) - 1), label="keep")]
    else:
        at = data.draw(st.integers(0, len(raw) - 1), label="offset")
        masks = data.draw(st.lists(st.integers(1, 255), min_size=1, max_size=300), label="xor")
        for i, m in enumerate(masks[:len(raw) - at]):  # every mask is non-zero: bytes change
            raw[at + i] ^= m
    path = tmp_path / "smear.moepack"
    path.write_bytes(raw)
    assert verify(path).exit_code in (1, 2)
