"""Resuming a conversion: what the journal header records, how a resumed run is checked
against it, and which journaled units still hold the bytes the journal says."""

from __future__ import annotations

import os
from pathlib import Path

import blake3
from moepack.convert.errors import ConvertError
from moepack.convert.journal import Journal, differences
from moepack.convert.plan import PLACEHOLDER_SHA, Plan
from moepack.convert.progress import Reporter
from moepack.convert.tasks import blob_unit, expert_unit, tensor_unit
from moepack.format.mtp import MTP_TENSOR

import moepack
from moepack.safefs import open_existing, printable

COMPARED = ("source", "settings", "converter", "layout")  # header keys that must not change


def unit_extents(plan: Plan) -> dict[str, tuple[int, int]]:
    """unit -> (offset, length) of its bytes in the file."""
    out = {tensor_unit(e.name): (e.offset, e.length)
           for e in plan.layout.sections if e.type in ("tensor", MTP_TENSOR)}
    out.update({blob_unit(e.name): (e.offset, e.length)
                for e in plan.layout.sections if e.type == "blob"})
    for b in plan.layout.banks():
        out.update({expert_unit(b.layer, e): (b.record_offset(e), b.stride)
                    for e in range(b.count)})
    return out


def unit_lengths(plan: Plan) -> dict[str, int]:
    return {u: n for u, (_, n) in unit_extents(plan).items()}


def journal_header(plan: Plan, fp: list[dict]) -> dict:
    placeholder = plan.layout.index_bytes({e.name: PLACEHOLDER_SHA for e in plan.layout.sections})
    m = plan.spec.manifest
    return {"source": m["source"]["files"], "settings": m["converter"]["settings"],
            "converter": moepack.__version__,
            "layout": blake3.blake3(placeholder).hexdigest(), "file_size": plan.layout.file_size,
            "file_stats": fp}


def known_hashes(jpath: Path) -> dict[str, tuple[int, int, str]]:
    head = Journal.read_header(jpath) or {}
    try:
        return {f["name"]: (f["size"], f["mtime_ns"], f["sha256"])
                for f in head.get("file_stats", [])}
    except (KeyError, TypeError):
        return {}


def check_same(old: dict, new: dict, partial: Path) -> None:
    """Refuse to resume `partial` unless source files, settings, converter and layout are the
    journal's; the message names changed files by name and says how to go on."""
    changed = source_changes(old.get("source"), new.get("source"))
    diffs = []
    for key in COMPARED[1:]:
        if key == "layout" and (changed or diffs):
            continue  # follows from the source or the settings: no news
        diffs += differences(old.get(key), new.get(key), key)
    if changed:
        shown = "; ".join(changed[:5]) + (f" (and {len(changed) - 5} more)"
                                          if len(changed) > 5 else "")
        also = f"; also {'; '.join(diffs[:3])}" if diffs else ""
        raise ConvertError(
            f"{partial} was started from other source files: {shown}{also}. Pass --restart "
            "to discard it and convert the source as it is now, or restore the original files "
            "to continue it")
    if diffs:
        shown = "; ".join(diffs[:5]) + (f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else "")
        raise ConvertError(
            f"{partial} was started with different settings: {shown}. Rerun with the original "
            "settings to continue it, or pass --restart to discard it")


def source_changes(old: object, new: object) -> list[str]:
    """What differs between two journaled source file lists ([{name, size, sha256}]), one item
    per file, by name."""
    def by_name(files: object) -> dict[str, dict]:
        if not isinstance(files, list):
            return {}
        return {f["name"]: f for f in files if isinstance(f, dict) and isinstance(f.get("name"),
                                                                                  str)}
    before, after = by_name(old), by_name(new)
    out = []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a is None:
            out.append(f"{printable(name)} is new")
        elif b is None:
            out.append(f"{printable(name)} is no longer there")
        elif a.get("size") != b.get("size"):
            out.append(f"{printable(name)} was {a.get('size')} bytes, now {b.get('size')}")
        elif a != b:
            out.append(f"{printable(name)} has other contents (SHA-256)")
    if not out and old != new:  # not file lists: report the raw difference
        out = differences(old, new, "source")
    return out


def damaged_units(partial: Path, plan: Plan, done: dict[str, str], rep: Reporter) -> list[str]:
    """Journaled units whose bytes in the partial file no longer hash as journaled (a disk
    error, a copied or edited file): they are redone, so the result is still exact."""
    extents = unit_extents(plan)
    rep.hashing(sum(extents.get(u, (0, 0))[1] for u in done), "checking")
    bad = []
    fd = open_existing(partial, os.O_RDONLY)  # never hash through a planted link
    try:
        for unit, hexd in done.items():
            off, n = extents.get(unit, (0, 0))
            if n == 0 or blake3.blake3(os.pread(fd, n, off)).hexdigest() != hexd:
                bad.append(unit)
            rep.hashed(n)
    finally:
        os.close(fd)
    return bad
