"""Units of conversion work: one task per decoder layer (its trunk tensors, then for a MoE layer
the codebooks and every expert), plus one for the global tensors. Tasks are plain data so they
can be sent to worker processes."""

from __future__ import annotations

from dataclasses import dataclass

from moepack.convert.adapters import EXPERT_PARTS
from moepack.convert.mapping import SourceMap
from moepack.convert.plan import Plan, layer_of
from moepack.convert.source import SourceRef


def tensor_unit(name: str) -> str:
    return f"tensor:{name}"


def blob_unit(name: str) -> str:
    return f"blob:{name}"


def expert_unit(layer: int, expert: int) -> str:
    return f"expert:{layer}:{expert}"


@dataclass(frozen=True)
class TrunkJob:
    name: str
    codec: dict
    ref: SourceRef


@dataclass(frozen=True)
class Task:
    key: str                                   # "globals" or "layer N"
    trunk: tuple[TrunkJob, ...]
    layer: int | None = None                   # MoE layer whose bank this task fills
    experts: tuple[tuple[int, dict[str, SourceRef]], ...] = ()

    def units(self) -> list[str]:
        out = [tensor_unit(j.name) for j in self.trunk]
        if self.layer is not None:
            out += [expert_unit(self.layer, e) for e, _ in self.experts]
        return out


def codebook_names(plan: Plan, layer: int) -> dict[str, tuple[str, str | None]]:
    """part -> (codebook tensor name, rotation tensor name or None)."""
    names = {t.name for t in plan.spec.tensors}
    out = {}
    for part in EXPERT_PARTS:
        rot = f"layers.{layer}.experts.{part}.rotation"
        out[part] = (f"layers.{layer}.experts.{part}.codebook", rot if rot in names else None)
    return out


def make_tasks(plan: Plan, smap: SourceMap) -> list[Task]:
    """Tasks in file order; codebook tensors are produced by their layer's task, not as trunk."""
    refs = {t.name: r for t, r in smap.trunk}
    by_layer: dict[int | None, list[TrunkJob]] = {}
    for t in plan.spec.tensors:
        if t.cls == "codebook":
            continue
        by_layer.setdefault(layer_of(t.name), []).append(TrunkJob(t.name, t.codec, refs[t.name]))
    moe = set(plan.adapter.all_moe_layers())
    count = int(plan.adapter.model["moe"]["num_experts"])
    tasks = [Task("globals", tuple(by_layer.pop(None, [])))]
    for layer in sorted(by_layer):
        experts = tuple((e, smap.experts[(layer, e)]) for e in range(count)) if layer in moe else ()
        tasks.append(Task(f"layer {layer}", tuple(by_layer[layer]),
                          layer if layer in moe else None, experts))
    return tasks
