"""The layout planner (spec/FORMAT.md sections 1, 4, 5): every offset and the exact file size from
the container's description alone, before any weight is read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moepack.format.canonical import canonical_json, check_writable
from moepack.format.codecs import uses_rvq
from moepack.format.errors import FormatError
from moepack.format.limits import (
    BANK_PARTS,
    DEFAULT_ALIGNMENT,
    FLAG_RVQ_TILED,
    MAX_ALIGNMENT,
    MAX_BLOB_RAW,
    MAX_EXPERTS,
    MAX_INDEX_LENGTH,
    MAX_LAYER,
    MAX_SECTIONS,
    MIN_ALIGNMENT,
    SECTION_ALIGNMENT,
    align_up,
)
from moepack.format.mtp import MTP_BANK, MTP_TENSOR
from moepack.format.rules import (
    check_blob_name,
    check_class_codec,
    check_int,
    check_name,
    check_shape,
    codec_nbytes,
    validate_manifest,
)

PLACEHOLDER_HASH = "0" * 64  # same width as a real hex hash, so the index length is known now


@dataclass(frozen=True)
class TensorSpec:
    name: str
    cls: str
    shape: tuple[int, ...]
    codec: dict
    kind: str = "tensor"  # or MTP_TENSOR: laid out after the banks (FORMAT.md §4.6)


@dataclass(frozen=True)
class BankSpec:
    layer: int
    count: int
    parts: tuple[TensorSpec, ...]  # gate, up, down (names "gate"/"up"/"down")
    kind: str = "expert_bank"  # or MTP_BANK: no hash table, one section hash


@dataclass(frozen=True)
class BlobSpec:
    name: str
    length: int
    compression: str = "none"
    raw_length: int | None = None


@dataclass(frozen=True)
class ContainerSpec:
    manifest: dict
    tensors: tuple[TensorSpec, ...]
    banks: tuple[BankSpec, ...]
    blobs: tuple[BlobSpec, ...]
    alignment: int = DEFAULT_ALIGNMENT


@dataclass(frozen=True)
class Extent:
    name: str
    type: str
    offset: int
    length: int


@dataclass(frozen=True)
class Part:
    name: str
    shape: tuple[int, ...]
    codec: dict
    offset: int  # within the record
    length: int


@dataclass(frozen=True)
class BankLayout:
    layer: int
    offset: int
    stride: int
    count: int
    record_length: int
    parts: tuple[Part, ...]
    hashes: str | None  # name of the expert_hashes section; None for an MTP bank

    def record_offset(self, expert: int) -> int:
        if not 0 <= expert < self.count:
            raise IndexError(f"layer {self.layer}: expert {expert} outside 0..{self.count - 1}")
        return self.offset + expert * self.stride


def bank_name(layer: int) -> str:
    return f"experts.{layer}"


def hashes_name(layer: int) -> str:
    return f"expert_hashes.{layer}"


def mtp_bank_name(layer: int) -> str:
    return f"mtp_experts.{layer}"


def where_mtp(layer: int) -> str:
    return f"MTP bank {layer!r}"


def plan_parts(parts: tuple[TensorSpec, ...], where: str) -> tuple[tuple[Part, ...], int]:
    """Offsets of a record's parts (each at a multiple of 64) and the record_length."""
    names = tuple(p.name for p in parts)
    if names != BANK_PARTS:
        raise FormatError(f"{where}.parts: names must be {list(BANK_PARTS)}, got {list(names)}",
                          "part_names")
    out, pos = [], 0
    for p in parts:
        pw = f"{where}.parts.{p.name}"
        shape = check_shape(list(p.shape), f"{pw}.shape")
        length = codec_nbytes(p.codec, shape, pw)
        off = align_up(pos, SECTION_ALIGNMENT)
        out.append(Part(p.name, shape, dict(p.codec), off, length))
        pos = off + length
    return tuple(out), pos


def pack_record(bank: BankLayout, parts: Mapping[str, bytes]) -> bytes:
    """Assemble one expert record (record_length bytes) from its encoded parts."""
    buf = bytearray(bank.record_length)
    for p in bank.parts:
        data = parts[p.name]
        if len(data) != p.length:
            raise ValueError(f"layer {bank.layer} {p.name}: {len(data)} bytes, planned {p.length}")
        buf[p.offset : p.offset + p.length] = data
    return bytes(buf)


class Layout:
    """Where every section lives. Build with plan_layout(); treat as read-only."""

    def __init__(self, spec: ContainerSpec, entries: list[dict[str, Any]], index_offset: int,
                 index_length: int) -> None:
        self.spec = spec
        self.alignment = spec.alignment
        self.entries = entries  # index section entries, hashes still placeholders
        self.index_offset = index_offset
        self.index_length = index_length
        self.file_size = index_offset + index_length
        self.sections: tuple[Extent, ...] = tuple(
            Extent(e["name"], e["type"], e["offset"], e["length"]) for e in entries
        )
        self._by_name = {x.name: x for x in self.sections}
        self._banks: dict[int, BankLayout] = {}
        for e in entries:
            if e["type"] in ("expert_bank", MTP_BANK):
                parts = tuple(
                    Part(p["name"], tuple(p["shape"]), p["codec"], p["offset"], p["length"])
                    for p in e["parts"]
                )
                self._banks[e["layer"]] = BankLayout(
                    e["layer"], e["offset"], e["stride"], e["count"], e["record_length"], parts,
                    e.get("hashes"),
                )

    @property
    def flags(self) -> int:
        """Header flags: bit 0 when any tensor or bank part is rvq (its codes are tiled, 1.1)."""
        return FLAG_RVQ_TILED if any(map(uses_rvq, self.entries)) else 0

    def _get(self, name: str, kind: str) -> Extent:
        ext = self._by_name.get(name)
        if ext is not None and (ext.type, kind) == (MTP_TENSOR, "tensor"):
            return ext  # MTP tensors are written like any tensor
        if ext is None or ext.type != kind:
            raise KeyError(f"no {kind} section named {name!r} in the layout")
        return ext

    def tensor(self, name: str) -> Extent:
        return self._get(name, "tensor")

    def blob(self, name: str) -> Extent:
        return self._get(name, "blob")

    def hashes(self, layer: int) -> Extent:
        return self._get(hashes_name(layer), "expert_hashes")

    def bank(self, layer: int) -> BankLayout:
        if layer not in self._banks:
            raise KeyError(f"no expert bank for layer {layer} in the layout")
        return self._banks[layer]

    def banks(self) -> list[BankLayout]:
        """Every bank to write, MTP banks included (they have no hash table)."""
        return list(self._banks.values())

    def index_bytes(self, hashes: Mapping[str, str], manifest: dict | None = None) -> bytes:
        """The index with the given hex hash per section name (banks carry none)."""
        sections = []
        for e in self.entries:
            e = dict(e)
            if "hash" in e:
                e["hash"] = hashes[e["name"]]
            sections.append(e)
        doc = {"manifest": self.spec.manifest if manifest is None else manifest,
               "sections": sections}
        return canonical_json(doc)


def _check_alignment(a: int) -> int:
    check_int(a, "alignment", MIN_ALIGNMENT, MAX_ALIGNMENT)
    if a & (a - 1):
        raise FormatError(f"alignment: {a} is not a power of two", "bad_alignment")
    return a


def _tensor_entry(t: TensorSpec, pos: int) -> dict[str, Any]:
    where = f"tensor {t.name!r}"
    if t.kind not in ("tensor", MTP_TENSOR):
        raise FormatError(f"{where}: section type {t.kind!r} is not a tensor type", "invalid")
    check_name(t.name, where)
    if not isinstance(t.cls, str) or not t.cls:
        raise FormatError(f"{where}.class: must be a non-empty string", "empty_class")
    shape = check_shape(list(t.shape), f"{where}.shape")
    length = codec_nbytes(t.codec, shape, where)
    check_class_codec(t.cls, t.codec, where)
    return {"type": t.kind, "name": t.name, "class": t.cls, "shape": list(shape),
            "codec": dict(t.codec), "offset": align_up(pos, SECTION_ALIGNMENT), "length": length,
            "hash": PLACEHOLDER_HASH}


def _blob_entry(b: BlobSpec, pos: int) -> dict[str, Any]:
    where = f"blob {b.name!r}"
    check_blob_name(check_name(b.name, where), f"{where}.name")
    check_int(b.length, f"{where}.length", 1)
    raw = b.length if b.raw_length is None else b.raw_length
    check_int(raw, f"{where}.raw_length", 0, MAX_BLOB_RAW)
    if b.compression not in ("none", "zstd"):
        raise FormatError(f"{where}.compression: {b.compression!r} is not 'none' or 'zstd'",
                          "blob_compression")
    if b.compression == "none" and raw != b.length:
        raise FormatError(f"{where}.raw_length: must equal length for compression 'none'",
                          "blob_raw_length")
    return {"type": "blob", "name": b.name, "compression": b.compression, "raw_length": raw,
            "offset": align_up(pos, SECTION_ALIGNMENT), "length": b.length,
            "hash": PLACEHOLDER_HASH}


def plan_layout(spec: ContainerSpec) -> Layout:
    """Plan every offset and the exact file size. Raises FormatError for an unwritable spec."""
    alignment = _check_alignment(spec.alignment)
    validate_manifest(spec.manifest, "manifest")
    entries: list[dict[str, Any]] = []
    pos = alignment  # the header region ends here
    for t in spec.tensors:
        if t.kind == MTP_TENSOR:
            continue  # after the banks
        entries.append(_tensor_entry(t, pos))
        pos = entries[-1]["offset"] + entries[-1]["length"]
    for b in spec.blobs:
        entries.append(_blob_entry(b, pos))
        pos = entries[-1]["offset"] + entries[-1]["length"]
    planned: list[tuple[BankSpec, tuple[Part, ...], int]] = []
    layers: set[int] = set()
    for bank in spec.banks:
        where = f"bank {bank.layer!r}"
        check_int(bank.layer, f"{where}.layer", 0, MAX_LAYER)
        check_int(bank.count, f"{where}.count", 1, MAX_EXPERTS)
        if bank.layer in layers:
            raise FormatError(f"{where}: a second bank for layer {bank.layer} (two banks for the "
                              "same layer)", "second_bank")
        layers.add(bank.layer)
        parts, record_length = plan_parts(tuple(bank.parts), where)
        planned.append((bank, parts, record_length))
        if bank.kind == MTP_BANK:
            continue  # hashed as one section
        if bank.kind != "expert_bank":
            raise FormatError(f"{where}: section type {bank.kind!r} is not a bank type",
                              "invalid")
        off = align_up(pos, SECTION_ALIGNMENT)
        entries.append({"type": "expert_hashes", "name": hashes_name(bank.layer), "offset": off,
                         "length": 32 * bank.count, "hash": PLACEHOLDER_HASH})
        pos = off + 32 * bank.count
    # regular banks first: an MTP bank then starts where the previous bank ends (no gap)
    for bank, parts, record_length in sorted(planned, key=lambda b: b[0].kind == MTP_BANK):
        stride = align_up(record_length, alignment)
        off = align_up(pos, alignment)
        entry = {
            "type": bank.kind, "name": bank_name(bank.layer), "layer": bank.layer,
            "count": bank.count, "stride": stride, "record_length": record_length,
            "offset": off, "length": bank.count * stride,
            "parts": [{"name": p.name, "shape": list(p.shape), "codec": p.codec,
                       "offset": p.offset, "length": p.length} for p in parts],
        }
        if bank.kind == MTP_BANK:
            if off - pos >= SECTION_ALIGNMENT:  # readers that do not know it allow < 64
                raise FormatError(f"{where_mtp(bank.layer)}: gap of {off - pos} bytes before "
                                  "it (must follow an expert bank)", "extent_gap")
            entry.update(name=mtp_bank_name(bank.layer), hash=PLACEHOLDER_HASH)
        else:
            entry["hashes"] = hashes_name(bank.layer)
        entries.append(entry)
        pos = off + bank.count * stride
    for t in spec.tensors:
        if t.kind == MTP_TENSOR:
            entries.append(_tensor_entry(t, pos))
            pos = entries[-1]["offset"] + entries[-1]["length"]
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise FormatError(f"duplicate section name (names repeat): {dup[:5]}", "duplicate_name")
    if len(entries) > MAX_SECTIONS:
        raise FormatError(f"{len(entries)} sections exceed the limit of {MAX_SECTIONS}",
                          "too_many_sections")
    index_offset = align_up(pos, SECTION_ALIGNMENT)
    doc = {"manifest": spec.manifest, "sections": entries}
    check_writable(spec.manifest, "index.manifest")  # the sections hold planner integers only
    index_length = len(canonical_json(doc))
    if index_length > MAX_INDEX_LENGTH:
        raise FormatError(f"index length {index_length} outside 2..{MAX_INDEX_LENGTH}",
                          "index_length")
    return Layout(spec, entries, index_offset, index_length)
