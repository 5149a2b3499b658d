"""Kimi K2.5 / K2.6 (`KimiK25ForConditionalGeneration`): the DeepSeek-V3 text model (MLA, sigmoid
group routing, shared experts) under `text_config`, its tensors under `language_model.`; the
routed experts usually INT4 compressed-tensors (pack-quantized, read by convert/packed_int.py).
Only the text model is converted: the vision tower and the multimodal projector are skipped and
the manifest says so (`source.skipped`, shown by `moepack info`)."""

from __future__ import annotations

from dataclasses import replace

from moepack.convert.adapters.base import TrunkTensor
from moepack.convert.adapters.deepseek_v3 import DeepseekV3Adapter

# Hub checkpoints (`language_model.model.…`, `language_model.lm_head`) first, then the names
# transformers >= 5 uses in memory (`model.language_model.…`, `lm_head`).
_PREFIXES = (("model.", ("language_model.model.", "model.language_model.")),
             ("lm_head.", ("language_model.lm_head.", "lm_head.")))


def _renamed(name: str) -> tuple[str, ...]:
    if name.startswith(("language_model.", "model.language_model.")):
        return (name,)  # already renamed (router names come from moe_prefixes)
    for old, new in _PREFIXES:
        if name.startswith(old):
            return tuple(n + name[len(old):] for n in new)
    return (name,)


class KimiK25Adapter(DeepseekV3Adapter):
    arch = "kimi_k25"
    hf_architecture = "KimiK25ForConditionalGeneration"
    hf_aliases = ("Kimi_K25ForConditionalGeneration",)  # transformers' own class name
    text_key = "text_config"
    skipped_parts = ("vision tower and multimodal projector (vision_tower.*, mm_projector.*): "
               "text-only conversion, images and video are not supported",)
    skipped_prefixes = ("vision_tower.", "mm_projector.", "model.vision_tower.",
                        "model.mm_projector.")

    def trunk(self) -> list[TrunkTensor]:
        return [replace(t, sources=tuple(dict.fromkeys(n for s in t.sources
                                                       for n in _renamed(s))))
                for t in super().trunk()]

    def moe_prefixes(self, layer: int) -> tuple[str, ...]:
        return tuple(n for p in super().moe_prefixes(layer) for n in _renamed(p))
