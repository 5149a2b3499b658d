"""The optional multi-token-prediction (MTP) sections (spec/FORMAT.md §4.6).

MTP layers (DeepSeek-V3's and GLM-4.5's `num_nextn_predict_layers`) are kept for a later
speculative decoder. They live in their own section types, which the engine (and any reader
that predates them) treats as unknown sections: their bytes are hashed and verified like any
section, and never loaded unless a caller asks for them."""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any

from moepack.format.errors import reject

MTP_TENSOR = "mtp_tensor"
MTP_BANK = "mtp_expert_bank"
MTP_TYPES = (MTP_TENSOR, MTP_BANK)


def check_mtp_bank(w: str, s: dict[str, Any], alignment: int) -> None:
    """What an MTP bank adds to an expert bank's rules: records aligned like a bank's, and
    no hash table (the section hash covers it)."""
    if s["offset"] % alignment:
        raise reject("misaligned", f"{w}.offset", f"{s['offset']} is not a multiple of {alignment}")
    if "hashes" in s:
        raise reject("bank_hash", f"{w}.hashes", "an MTP bank has no hash table")


def mtp_banks(sections: list[dict[str, Any]], banks: dict[int, dict[str, Any]],
              where: Callable[[int, dict[str, Any]], str]) -> dict[int, dict[str, Any]]:
    """MTP banks by layer: one per layer, and none for a layer that has an expert bank."""
    out: dict[int, dict[str, Any]] = {}
    for i, s in enumerate(sections):
        if s["type"] == MTP_BANK:
            if s["layer"] in out or s["layer"] in banks:
                raise reject("second_bank", f"{where(i, s)}.layer",
                             f"a second bank for layer {s['layer']}")
            out[s["layer"]] = s
    return out


def mtp_layer_of(name: str) -> int | None:
    """Decoder layer number of an MTP section name (`layers.L.…`), None for any other name."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1])
    return None


def mtp_summary(sections: list[dict[str, Any]]) -> dict[str, int] | None:
    """`{"layers", "bytes", "parameters"}` of a validated section list's MTP sections, or None
    when it has none. Codebooks count as bytes, not as parameters (as for the trunk)."""
    layers: set[int] = set()
    nbytes = params = 0
    for s in sections:
        if s["type"] == MTP_TENSOR:
            if (layer := mtp_layer_of(s["name"])) is not None:
                layers.add(layer)
            if s["class"] != "codebook":
                params += prod(s["shape"])
        elif s["type"] == MTP_BANK:
            layers.add(s["layer"])
            params += s["count"] * sum(prod(p["shape"]) for p in s["parts"])
        else:
            continue
        nbytes += s["length"]
    if not nbytes:
        return None
    return {"layers": len(layers), "bytes": nbytes, "parameters": params}
