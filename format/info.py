"""What `moepack info` reports about a container (keys documented in spec/FORMAT.md appendix A)."""

from __future__ import annotations

from math import prod
from typing import Any

from moepack.format.mtp import MTP_TYPES, mtp_summary
from moepack.format.reader import Container

INFO_SCHEMA = 1  # bump when a key of the --json output changes meaning or disappears


def _bpw(nbytes: int, params: int) -> float | None:
    return round(8 * nbytes / params, 4) if params else None


def container_info(c: Container) -> dict[str, Any]:
    """Sizes by class, parameter counts and bits per weight; pure function of the index."""
    classes: dict[str, dict[str, int]] = {}
    size = {"trunk": 0, "experts": 0, "codebooks": 0, "other": 0}
    params = {"trunk": 0, "experts": 0}
    experts = 0
    payload = 0  # expert bytes without the zero padding of each record up to its stride
    for s in c.sections:
        if s["type"] == "tensor":
            key = "codebooks" if s["class"] == "codebook" else "trunk"
            size[key] += s["length"]
            cls = classes.setdefault(s["class"], {"bytes": 0, "parameters": 0, "tensors": 0})
            cls["bytes"] += s["length"]
            cls["parameters"] += prod(s["shape"])
            cls["tensors"] += 1
            if key == "trunk":
                params["trunk"] += prod(s["shape"])
        elif s["type"] == "expert_bank":
            size["experts"] += s["length"]
            experts += s["count"]
            payload += s["count"] * s["record_length"]
            params["experts"] += s["count"] * sum(prod(p["shape"]) for p in s["parts"])
    c.mtp_banks()  # their rules first: they are not checked at open (FORMAT.md §4.6)
    mtp = mtp_summary(c.sections)  # kept for speculative decoding, not run
    if mtp:
        size["mtp"] = mtp["bytes"]
    size["other"] = c.file_size - sum(size.values())
    total = params["trunk"] + params["experts"]
    src = c.manifest["source"]
    skipped = src.get("skipped", [])  # strings (checked at open): parts not converted (§6)
    return {
        "schema": INFO_SCHEMA,
        "format_version": f"{c.version[0]}.{c.version[1]}",
        "container_id": c.id,
        "architecture": src["architecture"],
        "arch": c.model["arch"],
        "converter": f"{c.manifest['converter']['name']} {c.manifest['converter']['version']}",
        "alignment": c.alignment,
        "file_size": c.file_size,
        "parameters": {"total": total, **params},
        "bytes": size,
        "bits_per_weight": {
            "experts": _bpw(size["experts"], params["experts"]),
            "experts_payload": _bpw(payload, params["experts"]),
            "trunk": _bpw(size["trunk"], params["trunk"]),
            "overall": _bpw(size["trunk"] + size["experts"] + size["codebooks"], total),
        },
        "counts": {
            "sections": len(c.sections),
            "tensors": sum(1 for s in c.sections if s["type"] == "tensor"),
            "blobs": sum(1 for s in c.sections if s["type"] == "blob"),
            "expert_banks": len(c.banks()),
            "experts": experts,
            "unknown_sections": sum(
                1 for s in c.sections
                if s["type"] not in ("tensor", "blob", "expert_hashes", "expert_bank", *MTP_TYPES)
            ),
        },
        "classes": dict(sorted(classes.items())),
        "codecs": c.manifest["codecs"],
        **({"skipped": skipped} if skipped else {}),
        **({"mtp": mtp} if mtp else {}),
    }
