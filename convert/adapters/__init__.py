"""Architecture adapters: `adapter_for(config)` picks the one for a config.json."""

from __future__ import annotations

from moepack.convert.adapters.base import EXPERT_PARTS, Adapter, TrunkTensor
from moepack.convert.adapters.deepseek_v3 import DeepseekV3Adapter
from moepack.convert.adapters.deepseek_v32 import DeepseekV32Adapter
from moepack.convert.adapters.glm4_moe import Glm4MoeAdapter
from moepack.convert.adapters.glm5_next import Glm5NextAdapter
from moepack.convert.adapters.glm_moe_dsa import GlmMoeDsaAdapter
from moepack.convert.adapters.kimi_k3 import KimiK3Adapter
from moepack.convert.adapters.kimi_k25 import KimiK25Adapter
from moepack.convert.adapters.kimi_linear import KimiLinearAdapter
from moepack.convert.adapters.minimax_m2 import MiniMaxM2Adapter
from moepack.convert.adapters.mixtral import MixtralAdapter
from moepack.convert.adapters.qwen3_5_moe import Qwen3_5MoeAdapter
from moepack.convert.adapters.qwen3_moe import Qwen3MoeAdapter
from moepack.convert.adapters.qwen3_next import Qwen3NextAdapter
from moepack.convert.errors import UnsupportedArchitecture

ADAPTERS: tuple[type[Adapter], ...] = (MixtralAdapter, Qwen3MoeAdapter, DeepseekV3Adapter,
                                       Glm4MoeAdapter, MiniMaxM2Adapter, KimiK25Adapter,
                                       Qwen3NextAdapter, Qwen3_5MoeAdapter, DeepseekV32Adapter,
                                       GlmMoeDsaAdapter, KimiLinearAdapter, KimiK3Adapter,
                                       Glm5NextAdapter)
_BY_ARCH = {name: a for a in ADAPTERS for name in (a.hf_architecture, *a.hf_aliases)}
_BY_MODEL_TYPE = {a.arch: a for a in ADAPTERS}


def supported() -> list[str]:
    return [a.hf_architecture for a in ADAPTERS]


def adapter_for(config: dict) -> Adapter:
    """The adapter for config.json's `architectures` (or `model_type` when that is absent)."""
    archs = config.get("architectures") or []
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise UnsupportedArchitecture(f"config.json: 'architectures' must be a list of names, "
                                      f"got {repr(archs)[:80]}")
    for name in archs:
        if name in _BY_ARCH:
            return _BY_ARCH[name](config)
    model_type = config.get("model_type")
    if not archs and isinstance(model_type, str) and model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type](config)
    got = ", ".join(archs) or f"model_type {model_type!r}"
    raise UnsupportedArchitecture(f"config.json: unsupported architecture {got[:200]}; "
                                  f"supported: {', '.join(supported())}")


__all__ = ["ADAPTERS", "EXPERT_PARTS", "Adapter", "TrunkTensor", "adapter_for", "supported"]
