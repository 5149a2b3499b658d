"""Plan a conversion: the container spec and exact layout from a config alone (no weights read).

`plan_for_config` serves `moepack fetch --dry-run` (exact output size before downloading);
`plan_for_checkpoint` serves `convert` (also shape-checks every source tensor).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path

import blake3
from moepack.convert.adapters import EXPERT_PARTS, Adapter, adapter_for
from moepack.convert.errors import SourceError
from moepack.convert.mapping import SourceMap, bind, unused
from moepack.convert.quant import codec_for
from moepack.convert.settings import Settings
from moepack.convert.source import Checkpoint
from moepack.format import BankSpec, BlobSpec, ContainerSpec, Layout, TensorSpec, plan_layout
from moepack.format.codecs import codebook_shape, rotation_shape
from moepack.format.header import Header
from moepack.format.limits import MAJOR, MINOR
from moepack.format.model_desc import ModelDescError, validate_model
from moepack.format.mtp import MTP_BANK, MTP_TENSOR

import moepack
from moepack.safefs import printable

PLACEHOLDER_SHA = "0" * 64  # same width as a real hash: the layout does not change when known
CONVERTER = "moepack-convert"
_LAYER = re.compile(r"(.*\blayers\.)(\d+)\.")  # a decoder layer's tensor: (prefix, number)
_SHOWN_KINDS = 8  # name patterns a note about unused tensors lists


class UnusedTensorsWarning(UserWarning):
    """The checkpoint holds tensors that the model description does not use: not converted,
    listed in the manifest's source.skipped (`moepack convert` prints it as `warning: ...`)."""


@dataclass(frozen=True)
class Plan:
    spec: ContainerSpec
    layout: Layout
    adapter: Adapter


def codebook_specs(layer: int, codecs: Mapping[str, dict], shapes: Mapping[str, tuple[int, int]],
                   cb_codec: dict) -> list[TensorSpec]:
    # FORMAT.md §7 row order: the three codebooks, then the rotations (always f32).
    f32 = {"name": "f32"}
    out = [TensorSpec(f"layers.{layer}.experts.{part}.codebook", "codebook",
                      codebook_shape(codecs[part]), dict(cb_codec)) for part in EXPERT_PARTS]
    for part in EXPERT_PARTS:
        rot = rotation_shape(codecs[part], shapes[part])
        if rot is not None:
            out.append(TensorSpec(f"layers.{layer}.experts.{part}.rotation", "codebook", rot, f32))
    return out


def build_spec(adapter: Adapter, settings: Settings, files: list[dict],
               blobs: Mapping[str, int]) -> ContainerSpec:
    """The container description; `files` = manifest source files, `blobs` = name -> size."""
    rvq = settings.rvq
    shapes = {p: adapter.expert_shape(p) for p in EXPERT_PARTS}
    codecs = {p: codec_for(rvq, shapes[p], p) for p in EXPERT_PARTS}
    moe = set(adapter.moe_layers())
    cb_codec = settings.trunk_codec("codebook", 3)  # f32 or f16, checked by Settings
    tensors: list[TensorSpec] = []
    used: dict[str, dict] = {}
    trunk = adapter.trunk()
    for i, t in enumerate(trunk):
        codec = settings.trunk_codec(t.cls, len(t.shape))
        used.setdefault(t.cls, codec)
        tensors.append(TensorSpec(t.name, t.cls, t.shape, codec))
        layer = layer_of(t.name)
        nxt = layer_of(trunk[i + 1].name) if i + 1 < len(trunk) else None
        if layer in moe and nxt != layer:  # codebooks close their layer (FORMAT.md §7 order)
            tensors += codebook_specs(layer, codecs, shapes, cb_codec)
    for layer in adapter.mtp_layer_numbers():  # FORMAT.md §4.6: trunk codecs, own types
        for t in adapter.mtp_tensors(layer):
            codec = settings.trunk_codec(t.cls, len(t.shape))
            used.setdefault(t.cls, codec)
            tensors.append(TensorSpec(t.name, t.cls, t.shape, codec, MTP_TENSOR))
        if adapter.mtp_is_moe(layer):
            tensors += [replace(cb, kind=MTP_TENSOR)
                        for cb in codebook_specs(layer, codecs, shapes, cb_codec)]
    if moe:
        used["codebook"] = cb_codec
        used.update({f"expert.{p}": c for p, c in codecs.items()})
    count = int(adapter.model["moe"]["num_experts"])
    banks = tuple(
        BankSpec(layer, count, tuple(TensorSpec(p, "expert", shapes[p], codecs[p])
                                     for p in EXPERT_PARTS),
                 "expert_bank" if layer in moe else MTP_BANK)
        for layer in adapter.all_moe_layers())
    source = {"architecture": adapter.hf_architecture, "config": adapter.config,
              "files": sorted(files, key=lambda f: f["name"])}
    if skipped := adapter.skipped():
        source["skipped"] = skipped
    manifest = {
        "model": adapter.model,
        "source": source,
        "converter": {"name": CONVERTER, "version": moepack.__version__,
                      "settings": settings.as_manifest()},
        "codecs": used,
    }
    blob_specs = tuple(BlobSpec(name, size) for name, size in blobs.items() if size > 0)
    return ContainerSpec(manifest, tuple(tensors), banks, blob_specs, settings.alignment)


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "layers" else None


def described(config: dict) -> Adapter:
    """The adapter for `config`, its model description checked by the engine's rules
    (format/model_desc.py) before anything is sized by it or created; refusals name config.json
    and the field."""
    adapter = adapter_for(config)
    try:
        validate_model(adapter.model)
    except ModelDescError as e:
        raise SourceError(f"config.json: {config_field(adapter, e.field)} {e.reason}") from None
    _check_portable(config)  # after the rules: their messages say more about model fields
    return adapter


def _check_portable(config: dict) -> None:
    """config.json is copied into the manifest, whose canonical JSON has only finite numbers
    and 64-bit integers (FORMAT.md §3): refuse anything else here, naming the key."""
    stack: list[tuple[str, object]] = [(repr(k), v) for k, v in config.items()]
    while stack:
        where, v = stack.pop()
        if isinstance(v, dict):
            stack += [(f"{where}.{k}", x) for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(f"{where}[{i}]", x) for i, x in enumerate(v)]
        elif isinstance(v, float) and not math.isfinite(v):
            raise SourceError(f"config.json: {where[:120]} is {v}, which a container cannot hold")
        elif isinstance(v, int) and not -(1 << 63) <= v < (1 << 63):
            raise SourceError(f"config.json: {where[:120]} is an integer beyond 64 bits")


def config_field(adapter: Adapter, field: str) -> str:
    """`field` of the description as the config.json key a user can edit."""
    path = field.split("[")[0]
    parts = path.split(".")
    for n in range(len(parts), 0, -1):  # rope_scaling.factor: from config.json's rope_scaling
        prefix = ".".join(parts[:n])
        if prefix in adapter.origin:
            key = adapter.origin[prefix] + path[len(prefix):]
            return repr(key) if key == field else f"{key!r} (model description {field})"
    return f"(model description {field})"


def plan_for_config(config: dict, settings: Settings, files: list[dict] | None = None,
                    blobs: Mapping[str, int] | None = None,
                    names: Collection[str] | None = None) -> Layout:
    """Exact layout (and so `file_size`) of converting a checkpoint with this config.json.

    `files`: `[{name, size, sha256}]` of the weight files (sha256 may be unknown: any 64-hex
    placeholder gives the same size); `blobs`: sizes of tokenizer.json etc. to be embedded;
    `names`: the checkpoint's tensor names if known (they say whether the declared MTP layers
    are there; unknown: assumed there, as in the published checkpoints)."""
    return config_plan(config, settings, files, blobs, names).layout


def config_plan(config: dict, settings: Settings, files: list[dict] | None = None,
                blobs: Mapping[str, int] | None = None,
                names: Collection[str] | None = None) -> Plan:
    """`plan_for_config` with its spec and adapter (`convert --dry-run` of a folder that holds
    a config.json and no weights)."""
    files = [{"name": f["name"], "size": int(f["size"]),
              "sha256": f.get("sha256") or PLACEHOLDER_SHA} for f in (files or [])]
    adapter = described(config)
    choose_mtp(adapter, settings, names)
    spec = build_spec(adapter, settings, files, blobs or {})
    return Plan(spec, plan_layout(spec), adapter)


def choose_mtp(adapter: Adapter, settings: Settings, names: Collection[str] | None) -> None:
    """How many of the declared MTP layers to convert (FORMAT.md §4.6): with `--mtp keep`, the
    leading ones the checkpoint holds (`names`; None: assume all, for planning from a config
    alone). A layer that is present in part fails later, naming the missing tensor."""
    declared = adapter.mtp_declared()
    if not declared or not adapter.mtp_tensors(int(adapter.model["num_layers"])):
        return  # nothing declared, or the architecture's MTP layers are not supported
    if settings.mtp == "drop":
        adapter.mtp_note = "dropped by --mtp drop"
        return
    first = int(adapter.model["num_layers"])
    kept = 0
    for layer in range(first, first + declared):
        if names is not None and not any(s in names for t in adapter.mtp_tensors(layer)
                                         for s in t.sources):
            break
        kept += 1
    adapter.mtp_layers = kept


def checkpoint_plan(ck: Checkpoint, settings: Settings,
                    files: list[dict] | None = None) -> tuple[Plan, SourceMap]:
    """Plan for an opened checkpoint; validates every source tensor against config.json."""
    adapter = described(ck.config)
    choose_mtp(adapter, settings, ck.tensors.keys())
    smap = bind(ck, adapter)
    account_unused(ck, adapter, smap)
    if files is None:
        files = [{"name": f, "size": (ck.dir / f).stat().st_size, "sha256": PLACEHOLDER_SHA}
                 for f in ck.files]
    spec = build_spec(adapter, settings, files, ck.blob_sizes())
    return Plan(spec, plan_layout(spec), adapter), smap


def account_unused(ck: Checkpoint, adapter: Adapter, smap: SourceMap) -> None:
    """Say what of the checkpoint the container leaves out. Tensors of decoder layers beyond
    the config's `num_hidden_layers` (and its declared MTP layers) are refused: the config does
    not describe these weights, and a model cut short would convert, verify and then answer
    badly. Any other unused tensor (an MTP module the architecture's adapter does not read,
    a stray buffer) is summarised in `adapter.unused_note`, which goes into the manifest's
    source.skipped (shown by `info`), and warned about. The parts an adapter skips by design
    (vision towers) are already listed there."""
    names = [n for n in unused(ck, smap) if not n.startswith(adapter.skipped_prefixes)]
    if not names:
        return
    first = int(adapter.model["num_layers"])
    declared = adapter.mtp_declared()  # converted or not, adapter.skipped() accounts for them
    decoder = {m.group(1) for _, r in smap.trunk if (m := _LAYER.match(r.name))}
    beyond: list[tuple[int, str]] = []
    rest = []
    for n in names:
        m = _LAYER.match(n)
        layer = int(m.group(2)) if m and m.group(1) in decoder else -1
        if layer >= first + declared:
            beyond.append((layer, n))
        elif layer < first:
            rest.append(n)
    if beyond:
        layers = sorted({layer for layer, _ in beyond})
        shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
        key = adapter.origin.get("num_layers", "num_hidden_layers")
        mtp = f" (and {declared} multi-token-prediction layer(s))" if declared else ""
        n = beyond[0][1]
        raise SourceError(f"config.json: {key!r} is {first}{mtp}, but the checkpoint also "
                          f"holds layer{'s' if len(layers) > 1 else ''} {shown} ("
                          f"{len(beyond):,} tensors, e.g. {printable(n, 120)} in "
                          f"{ck.tensors[n].file}); converting would leave them out: fix "
                          "config.json or the checkpoint")
    if rest:
        adapter.unused_note = unused_note(rest)
        warnings.warn(f"{adapter.unused_note}; they are not converted (listed in the "
                      "manifest's source.skipped)", UnusedTensorsWarning, stacklevel=2)


def unused_note(names: list[str]) -> str:
    """One line about tensors left out: their names with layer and expert numbers as `*`,
    each pattern with its count, the first few patterns only."""
    kinds: dict[str, int] = {}
    for n in names:
        kind = re.sub(r"(?<=\.)\d+(?=\.|$)", "*", n)
        kinds[kind] = kinds.get(kind, 0) + 1
    shown = [printable(k, 120) + (f" (x{c:,})" if c > 1 else "")
             for k, c in list(kinds.items())[:_SHOWN_KINDS]]
    more = len(kinds) - _SHOWN_KINDS
    return (f"{len(names):,} checkpoint tensor{'s' if len(names) > 1 else ''} that config.json "
            f"does not describe: {', '.join(shown)}" + (f" and {more:,} more kinds" if more > 0
                                                        else ""))


def plan_for_checkpoint(src: str | Path, settings: Settings) -> tuple[ContainerSpec, Layout]:
    plan, _ = checkpoint_plan(Checkpoint(src), settings)
    return plan.spec, plan.layout


def weight_counts(plan: Plan) -> tuple[int, int]:
    """(all weights, routed-expert weights) of the planned model."""
    trunk = sum(prod(t.shape) for t in plan.spec.tensors if t.cls != "codebook")
    experts = sum(b.count * sum(prod(p.shape) for p in b.parts) for b in plan.spec.banks)
    return trunk + experts, experts


def write_index_only(layout: Layout, path: str | os.PathLike) -> None:
    """The container `layout` describes, without payloads: header and index (placeholder hashes)
    in a sparse file of the planned size, so the engine's own planner reads what the converter
    would write (`moepack plan --config`) without gigabytes of weights. Every payload reads as
    zeros: for planning only, never for running."""
    hashes = {e["name"]: e["hash"] for e in layout.entries if "hash" in e}
    index = layout.index_bytes(hashes)
    header = Header(MAJOR, MINOR, layout.flags, layout.alignment, layout.file_size,
                    layout.index_offset, layout.index_length, blake3.blake3(index).digest())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, layout.file_size)  # holes: no disk blocks for the payloads
        os.pwrite(fd, index, layout.index_offset)
        os.pwrite(fd, header.pack(), 0)
    finally:
        os.close(fd)
