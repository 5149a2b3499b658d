"""Turn a scan's digests into damage: compare sections with the index, records with their tables.

A record is judged against its bank's `expert_hashes` table as read from disk. When that table
is itself damaged, its entries cannot be trusted, but the index still holds the table's true
hash: if the BLAKE3 of the records' *computed* hashes equals it, every record is intact and only
the table is damaged. Otherwise records that disagree with the damaged table are reported too,
marked as judged against a damaged table.
"""

from __future__ import annotations

import blake3
from moepack.format.limits import HEADER_SIZE
from moepack.verify.plan import Item
from moepack.verify.report import Damage
from moepack.verify.scan import ScanResult

HASH = 32
CONTENT_HASH = "content_hash"  # bytes that do not match their BLAKE3 (FORMAT.md §11.1)
# Non-zero bytes in a gap or record padding: no open-time rule reads them, so "any other
# violation"; only the header region's padding has a code of its own.
PADDING = "invalid"
HEADER_PADDING = "header_padding"


def _damage(item: Item, detail: str, code: str | None) -> Damage:
    return Damage(item.kind, item.name, item.offset, item.length, detail, code)


def _gap_code(lo: int, alignment: int) -> str:
    return HEADER_PADDING if HEADER_SIZE <= lo < alignment else PADDING


def _sections(items: list[Item], res: ScanResult, alignment: int) -> list[Damage]:
    out = []
    for i, item in enumerate(items):
        if i in res.unreadable:
            out.append(_damage(item, res.unreadable[i], res.unreadable_codes.get(i)))
        elif item.check == "hash" and res.digests.get(i) != item.expect:
            out.append(_damage(item, "BLAKE3 differs from the index", CONTENT_HASH))
        elif item.check == "zero" and i in res.nonzero:
            lo, hi = res.nonzero[i]
            out.append(Damage("padding", "padding", lo, hi - lo,
                              f"non-zero bytes in the gap {item.offset}..{item.end}",
                              _gap_code(lo, alignment)))
    return out


Found = tuple[list[Damage], list[str]]  # damage, notes


def _layer_records(layer: int, idx: list[int], t: int, items: list[Item],
                   res: ScanResult) -> Found:
    """Judge the records `idx` of one layer against hash table item `t`."""
    table = bytes(res.kept.get(t, b""))
    table_ok = res.digests.get(t) == items[t].expect
    computed = [res.digests.get(i) for i in idx]
    notes: list[str] = []
    cleared = not table_ok and None not in computed and \
        blake3.blake3(b"".join(computed)).digest() == items[t].expect  # type: ignore[arg-type]
    if cleared:
        notes.append(f"layer {layer}: hash table damaged, but all {len(idx)} records match the "
                     "table's hash in the index")
    detail = "BLAKE3 differs from expert_hashes" if table_ok else \
        "judged against a damaged hash table"
    out: list[Damage] = []
    for e, i in enumerate(idx):
        if i in res.unreadable:
            continue  # reported with the sections
        if not cleared and computed[e] != table[e * HASH:(e + 1) * HASH]:
            out.append(_damage(items[i], detail, CONTENT_HASH))
        elif i in res.nonzero:  # intact as written, but the writer broke the zero rule
            lo, hi = res.nonzero[i]
            out.append(Damage("padding", "padding", lo, hi - lo,
                              f"non-zero record padding in {items[i].name}", PADDING))
    return out, notes


def _records(items: list[Item], res: ScanResult, tables: dict[int, str]) -> Found:
    """Damage among expert records, and notes about tables that could not be trusted."""
    by_name = {item.name: i for i, item in enumerate(items) if item.kind == "expert_hashes"}
    records: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        if item.check == "record" and item.layer is not None:
            records.setdefault(item.layer, []).append(i)
    out: list[Damage] = []
    notes: list[str] = []
    for layer, idx in records.items():
        t = by_name.get(tables.get(layer, ""))
        if t is None or t in res.unreadable:
            notes.append(f"layer {layer}: hash table unreadable; records not verified")
            continue
        damage, more = _layer_records(layer, idx, t, items, res)
        out += damage
        notes += more
    return out, notes


def judge(items: list[Item], res: ScanResult, tables: dict[int, str], *,
          alignment: int = HEADER_SIZE) -> Found:
    """All damage in file order, plus notes. `alignment`: the header's, which ends the header
    region (non-zero bytes before it are `header_padding`)."""
    damage = _sections(items, res, alignment)
    rec, notes = _records(items, res, tables)
    return sorted(damage + rec, key=lambda d: d.offset), notes
