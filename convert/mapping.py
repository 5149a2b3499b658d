"""Bind an adapter's canonical tensors to a checkpoint's tensors, checking every shape and dtype
up front (header reads only), so a bad source fails before anything is written."""

from __future__ import annotations

from dataclasses import dataclass

from moepack.convert.adapters import EXPERT_PARTS, Adapter, TrunkTensor
from moepack.convert.errors import SourceError
from moepack.convert.source import Checkpoint, SourceRef


@dataclass(frozen=True)
class SourceMap:
    trunk: tuple[tuple[TrunkTensor, SourceRef], ...]
    experts: dict[tuple[int, int], dict[str, SourceRef]]  # (layer, expert) -> part -> ref

    def expert(self, layer: int, expert: int, part: str) -> SourceRef:
        return self.experts[(layer, expert)][part]


def bind(ck: Checkpoint, adapter: Adapter) -> SourceMap:
    """Resolve and shape-check every tensor; raises SourceError naming file and tensor."""
    names = ck.tensors.keys()
    trunk = []
    mtp = [t for layer in adapter.mtp_layer_numbers() for t in adapter.mtp_tensors(layer)]
    for t in adapter.trunk() + mtp:
        ref = adapter.resolve(t, names)
        ck.check_shape(ref, t.shape, t.name)
        ck.check_readable(ref)
        trunk.append((t, ref))
    experts = {}
    count = int(adapter.model["moe"]["num_experts"])
    for layer in adapter.all_moe_layers():
        for e in range(count):
            refs = adapter.expert_refs(layer, e, names)
            if e == 0:
                _check_fused_count(ck, refs, count)
            for part in EXPERT_PARTS:
                ck.check_shape(refs[part], adapter.expert_shape(part),
                               f"layers.{layer} expert {e} {part}")
                ck.check_readable(refs[part])
            experts[(layer, e)] = refs
    return SourceMap(tuple(trunk), experts)


def unused(ck: Checkpoint, smap: SourceMap) -> list[str]:
    """The checkpoint's tensors that no bound reference reads, in header order."""
    refs = [r for _, r in smap.trunk] + [r for parts in smap.experts.values()
                                         for r in parts.values()]
    read = {n for name in {r.name for r in refs} for n in ck.stored(name)}
    return [n for n in ck.stored_names() if n not in read]


def _check_fused_count(ck: Checkpoint, refs: dict[str, SourceRef], count: int) -> None:
    """A fused `[E, ...]` expert tensor must hold exactly the config's number of experts."""
    for ref in refs.values():
        if ref.index is not None:
            info = ck.info(ref.name)
            if info.shape[0] != count:
                raise SourceError(f"{info.file}: tensor {ref.name!r} holds {info.shape[0]} "
                                  f"experts, but config.json says {count}")
