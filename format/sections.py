"""Validation of the index's `sections` array (spec/FORMAT.md sections 4 and 5), in spec order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moepack.format.errors import reject
from moepack.format.header import Header
from moepack.format.limits import (
    BANK_PARTS,
    FLAG_RVQ_TILED,
    MAX_BLOB_RAW,
    MAX_EXPERTS,
    MAX_LAYER,
    MAX_SECTIONS,
    SECTION_ALIGNMENT,
    align_up,
)
from moepack.format.mtp import MTP_BANK, MTP_TENSOR, check_mtp_bank, mtp_banks
from moepack.format.rules import (
    check_blob_name,
    check_class_codec,
    check_hex_hash,
    check_int,
    check_list,
    check_name,
    check_obj,
    check_shape,
    check_str,
    codec_nbytes,
    required,
)

KNOWN_TYPES = ("tensor", "blob", "expert_hashes", "expert_bank")


@dataclass(frozen=True)
class Sections:
    """The validated sections, with lookups the reader needs."""

    all: list[dict[str, Any]]
    by_name: dict[str, dict[str, Any]]
    banks: dict[int, dict[str, Any]]  # layer -> expert_bank entry


def _where(i: int, s: dict[str, Any]) -> str:
    name = s.get("name")
    label = f" ({name!r})" if isinstance(name, str) and len(name) <= 128 else ""
    return f"index.sections[{i}]{label}"


def _check_common(i: int, s: Any, h: Header) -> tuple[str, int, int]:
    w = f"index.sections[{i}]"
    s = check_obj(s, w)
    w = _where(i, s)
    kind = check_str(required(s, "type", w), f"{w}.type")
    check_name(required(s, "name", w), f"{w}.name")
    offset = check_int(required(s, "offset", w), f"{w}.offset")
    length = check_int(required(s, "length", w), f"{w}.length", 1)
    need = h.alignment if kind == "expert_bank" else SECTION_ALIGNMENT
    if offset % need:
        raise reject("misaligned", f"{w}.offset", f"{offset} is not a multiple of {need}")
    if offset < h.alignment:
        raise reject("header_region", f"{w}.offset",
                     f"{offset} lies in the header region (< {h.alignment})")
    if offset + length > h.index_offset:  # Python ints: no overflow; both are <= 2^63-1
        raise reject("past_index", w,
                     f"extent {offset}+{length} runs past the index at offset {h.index_offset}")
    if kind == "expert_bank":
        if "hash" in s:
            raise reject("bank_hash", f"{w}.hash", "expert banks carry no section hash")
    else:
        check_hex_hash(required(s, "hash", w), f"{w}.hash")
    return kind, offset, length


def _check_extents(sections: list[dict[str, Any]], h: Header) -> None:
    """Sorted, non-overlapping, packed as tightly as alignment allows (no hidden bytes)."""
    end = h.alignment
    for i, s in enumerate(sections):
        w = _where(i, s)
        if s["offset"] < end:
            raise reject("extent_overlap", f"{w}.offset",
                         f"{s['offset']} overlaps the previous extent (ending at {end})")
        need = h.alignment if s["type"] == "expert_bank" else SECTION_ALIGNMENT
        if s["offset"] - end >= need:
            raise reject("extent_gap", f"{w}.offset",
                         f"gap of {s['offset'] - end} bytes before it (must be < {need})")
        end = s["offset"] + s["length"]
    if h.index_offset - end >= SECTION_ALIGNMENT:
        raise reject("extent_gap", "header.index_offset", f"gap of {h.index_offset - end} bytes "
                     f"before the index (must be < {SECTION_ALIGNMENT})", 32)


def _check_layout_flag(w: str, codec: dict, h: Header) -> None:
    """rvq codes are tiled since 1.1 (CODECS.md §3); a 1.0 file's rows would be misread."""
    if codec["name"] == "rvq" and not h.flags & FLAG_RVQ_TILED:
        raise reject("needs_reconversion", f"{w}.codec", "rvq codes without header flag bit 0 "
                     "(64-row tiles): the file was made by format 1.0 and must be reconverted: "
                     "run `moepack convert` on its source checkpoint again")


def _check_tensor(w: str, s: dict[str, Any], h: Header) -> None:
    cls = check_str(required(s, "class", w), f"{w}.class")
    if not cls:
        raise reject("empty_class", f"{w}.class", "empty")
    shape = check_shape(required(s, "shape", w), f"{w}.shape")
    n = codec_nbytes(required(s, "codec", w), shape, w)
    check_class_codec(cls, s["codec"], w)
    _check_layout_flag(w, s["codec"], h)
    if n != s["length"]:
        raise reject("length_mismatch", f"{w}.length",
                     f"{s['length']} != {n} bytes for shape × codec")


def _check_blob(w: str, s: dict[str, Any]) -> None:
    check_blob_name(s["name"], f"{w}.name")
    comp = required(s, "compression", w)
    if comp not in ("none", "zstd"):
        raise reject("blob_compression", f"{w}.compression", f"{comp!r} is not 'none' or 'zstd'")
    raw = check_int(required(s, "raw_length", w), f"{w}.raw_length", 0, MAX_BLOB_RAW)
    if comp == "none" and raw != s["length"]:
        raise reject("blob_raw_length", f"{w}.raw_length",
                     f"{raw} != length {s['length']} for compression 'none'")


def _check_parts(w: str, s: dict[str, Any], h: Header) -> int:
    parts = check_list(required(s, "parts", w), f"{w}.parts")
    names = [required(check_obj(p, f"{w}.parts[{j}]"), "name", f"{w}.parts[{j}]")
             for j, p in enumerate(parts)]
    if tuple(names) != BANK_PARTS:
        raise reject("part_names", f"{w}.parts", f"names must be {list(BANK_PARTS)} in order")
    pos = 0
    for j, p in enumerate(parts):
        pw = f"{w}.parts[{j}]"
        shape = check_shape(required(p, "shape", pw), f"{pw}.shape")
        n = codec_nbytes(required(p, "codec", pw), shape, pw)
        _check_layout_flag(pw, p["codec"], h)
        off = check_int(required(p, "offset", pw), f"{pw}.offset")
        length = check_int(required(p, "length", pw), f"{pw}.length", 1)
        if off != align_up(pos, SECTION_ALIGNMENT):
            raise reject("part_offset", f"{pw}.offset",
                         f"{off} != {align_up(pos, SECTION_ALIGNMENT)}")
        if length != n:
            raise reject("length_mismatch", f"{pw}.length",
                         f"{length} != {n} bytes for shape × codec")
        pos = off + length
    return pos


def _check_bank(w: str, s: dict[str, Any], h: Header) -> None:
    alignment = h.alignment
    check_int(required(s, "layer", w), f"{w}.layer", 0, MAX_LAYER)
    count = check_int(required(s, "count", w), f"{w}.count", 1, MAX_EXPERTS)
    stride = check_int(required(s, "stride", w), f"{w}.stride", 1)
    record_length = check_int(required(s, "record_length", w), f"{w}.record_length", 1)
    if s["type"] == MTP_BANK:
        check_mtp_bank(w, s, alignment)
    else:
        check_name(required(s, "hashes", w), f"{w}.hashes")
    if stride % alignment:
        raise reject("stride", f"{w}.stride",
                     f"{stride} is not a multiple of the alignment {alignment}")
    if count * stride != s["length"]:
        raise reject("bank_length", f"{w}.length",
                     f"{s['length']} != count {count} × stride {stride}")
    end = _check_parts(w, s, h)
    if record_length != end:
        raise reject("record_length", f"{w}.record_length",
                     f"{record_length} != end of last part {end}")
    if stride != align_up(record_length, alignment):
        raise reject("stride", f"{w}.stride", f"{stride} != record_length rounded up to the "
                     f"alignment ({align_up(record_length, alignment)})")


def validate_sections(value: Any, h: Header) -> Sections:
    """Check every section's keys, types and extents, then the cross-references."""
    sections = check_list(value, "index.sections")
    if len(sections) > MAX_SECTIONS:
        raise reject("too_many_sections", "index.sections",
                     f"{len(sections)} entries exceed {MAX_SECTIONS}")
    by_name: dict[str, dict[str, Any]] = {}
    for i, s in enumerate(sections):
        kind, _, _ = _check_common(i, s, h)
        w = _where(i, s)
        if s["name"] in by_name:
            raise reject("duplicate_name", f"{w}.name", "duplicate section name")
        by_name[s["name"]] = s
        if kind == "tensor":
            _check_tensor(w, s, h)
        elif kind == "blob":
            _check_blob(w, s)
        elif kind == "expert_hashes" and s["length"] % 32:
            raise reject("hash_table_length", f"{w}.length",
                         f"{s['length']} is not a multiple of 32")
        elif kind == "expert_bank":
            _check_bank(w, s, h)
    _check_extents(sections, h)
    banks: dict[int, dict[str, Any]] = {}
    users: dict[str, str] = {}
    for i, s in enumerate(sections):
        if s["type"] != "expert_bank":
            continue
        w = _where(i, s)
        if s["layer"] in banks:
            raise reject("second_bank", f"{w}.layer", f"a second bank for layer {s['layer']}")
        banks[s["layer"]] = s
        table = by_name.get(s["hashes"])
        if table is None or table["type"] != "expert_hashes":
            raise reject("missing_hash_table", f"{w}.hashes",
                         f"no expert_hashes section named {s['hashes']!r}")
        if s["hashes"] in users:
            raise reject("hash_table_shared", f"{w}.hashes",
                         f"{s['hashes']!r} already used by {users[s['hashes']]}")
        users[s["hashes"]] = s["name"]
        if table["length"] != 32 * s["count"]:
            raise reject("hash_table_length", f"{w}.hashes", f"{s['hashes']!r} has length "
                         f"{table['length']}, expected count × 32 = {32 * s['count']}")
    for i, s in enumerate(sections):
        if s["type"] == "expert_hashes" and s["name"] not in users:
            raise reject("orphan_hash_table", _where(i, s),
                         "no expert bank refers to this hash table")
    return Sections(sections, by_name, banks)


def validate_mtp(sections: Sections, h: Header) -> dict[int, dict[str, Any]]:
    """The MTP sections' own rules (FORMAT.md §4.6), checked when a caller asks for them: `open`
    checks them as unknown sections, as every reader that does not know them does, so the
    readers agree on every file. Returns the MTP banks by layer."""
    for i, s in enumerate(sections.all):
        if s["type"] == MTP_TENSOR:
            _check_tensor(_where(i, s), s, h)
        elif s["type"] == MTP_BANK:
            _check_bank(_where(i, s), s, h)
    return mtp_banks(sections.all, sections.banks, _where)
