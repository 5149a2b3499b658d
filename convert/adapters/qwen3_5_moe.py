"""Qwen3.5-MoE (`Qwen3_5MoeForConditionalGeneration`): Qwen3-Next's decoder (Gated DeltaNet and
gated full attention, `(1 + w)` norms, sigmoid-gated shared expert, every layer MoE) under
`text_config`, its tensors under `model.language_model.`, with the DeltaNet input projections
stored split (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`). Text positions only: the
multimodal RoPE sections all see the same position, which is plain RoPE. Only the text model is
converted: the vision tower is skipped and the manifest says so (`source.skipped`)."""

from __future__ import annotations

from dataclasses import replace

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.qwen3_next import Qwen3NextAdapter


def _renamed(name: str) -> str:
    if name.startswith("model.") and not name.startswith("model.language_model."):
        return "model.language_model." + name[len("model."):]
    return name


class Qwen3_5MoeAdapter(Qwen3NextAdapter):
    arch = "qwen3_5_moe"
    hf_architecture = "Qwen3_5MoeForConditionalGeneration"
    text_key = "text_config"
    projection = "split"
    skipped_parts = ("vision tower (model.visual.*): text-only conversion, images and video are "
                     "not supported",)
    skipped_prefixes = ("model.visual.",)

    def trunk(self) -> list[TrunkTensor]:
        return [replace(t, sources=tuple(dict.fromkeys(_renamed(s) for s in t.sources)))
                for t in super().trunk()]

    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        return tuple(_renamed(p) for p in super().moe_prefixes(layer))
