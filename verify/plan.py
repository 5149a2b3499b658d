"""Turn a container's section list into the items a full verification checks, in file order.

Every byte between the header and the index belongs to exactly one item: a hashed section, one
expert record, or a gap (header-region padding, padding between sections, before the index)
that must be zero. Items are contiguous and sorted, so one sequential pass checks them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Check = Literal["hash", "record", "zero", "none"]

_SECTION_KINDS = {"tensor": "tensor", "blob": "blob", "expert_hashes": "expert_hashes"}


@dataclass(slots=True)  # one per expert record: tens of thousands in a big model
class Item:
    """`check`: "hash" = BLAKE3 against `expect`; "record" = expert record, judged against its
    bank's hash table; "zero" = padding, must be zero; "none" = nothing to check."""

    kind: str
    name: str
    offset: int
    length: int
    check: Check
    expect: bytes | None = None
    layer: int | None = None
    expert: int | None = None
    keep: bool = False  # keep the bytes: hash tables are needed to judge records
    zeros: tuple[tuple[int, int], ...] = ()  # record padding, [start, end) within the item

    @property
    def end(self) -> int:
        return self.offset + self.length


def _hash_bytes(section: dict) -> bytes | None:
    value = section.get("hash")
    if not isinstance(value, str):
        return None
    try:
        digest = bytes.fromhex(value)
    except ValueError:
        return None
    return digest if len(digest) == 32 else None


def _record_padding(bank: dict) -> tuple[tuple[int, int], ...]:
    """Zero ranges of a record: between parts and after record_length (FORMAT.md section 9)."""
    out, at = [], 0
    for part in sorted(bank["parts"], key=lambda p: p["offset"]):
        if part["offset"] > at:
            out.append((at, part["offset"]))
        at = part["offset"] + part["length"]
    if bank["stride"] > at:
        out.append((at, bank["stride"]))
    return tuple(out)


def _section_items(section: dict) -> list[Item]:
    kind, name = section["type"], section["name"]
    offset, length = section["offset"], section["length"]
    if kind == "expert_bank":
        layer, stride = section["layer"], section["stride"]
        zeros = _record_padding(section)
        return [
            Item("expert", f"layer {layer} expert {e}", offset + e * stride, stride, "record",
                 layer=layer, expert=e, zeros=zeros)
            for e in range(section["count"])
        ]
    expect = _hash_bytes(section)
    return [Item(
        _SECTION_KINDS.get(kind, "section"), name, offset, length,
        "hash" if expect is not None else "none", expect, keep=kind == "expert_hashes",
    )]


def _gap(start: int, end: int) -> list[Item]:
    return [Item("padding", "padding", start, end - start, "zero")] if end > start else []


def build_items(sections: Iterable[dict], start: int, end: int) -> list[Item]:
    """Items covering [start, end): `start` = end of the header, `end` = index offset.

    `sections` must already be validated (sorted, non-overlapping, inside [start, end)).
    """
    items: list[Item] = []
    at = start
    for section in sorted(sections, key=lambda s: s["offset"]):
        items += _gap(at, section["offset"])
        items += _section_items(section)
        at = section["offset"] + section["length"]
    items += _gap(at, end)
    return items


def tables_by_layer(sections: Iterable[dict]) -> dict[int, str]:
    """Bank layer -> name of its expert_hashes section."""
    return {s["layer"]: s["hashes"] for s in sections if s["type"] == "expert_bank"}
