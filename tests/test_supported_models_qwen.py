"""docs/configs' Qwen3-Next and Qwen3.5 configs describe the hybrids their cards publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moepack.convert.plan import described

CONFIGS = Path(__file__).resolve().parent.parent / "docs" / "configs"


@pytest.mark.parametrize(("stem", "layers", "value_heads", "inter", "projection"), [
    ("Qwen3-Next-80B-A3B", 48, 32, 512, "grouped_qkvz"),
    ("Qwen3.5-397B-A17B", 60, 64, 1024, "split"),
])
def test_qwen_hybrid_configs(stem: str, layers: int, value_heads: int, inter: int,
                             projection: str) -> None:
    m = described(json.loads((CONFIGS / f"{stem}.json").read_text())).model
    assert m["num_layers"] == layers and m["layer_attention"].count("full") == layers // 4
    assert m["layer_attention"][:4] == ["linear"] * 3 + ["full"]
    assert m["attention"] == {"kind": "gqa", "rotary_dim": 64, "output_gate": True}
    assert m["linear_attention"] == {"kind": "gated_deltanet", "projection": projection,
                                     "num_key_heads": 16, "num_value_heads": value_heads,
                                     "key_head_dim": 128, "value_head_dim": 128,
                                     "conv_kernel_size": 4}
    moe = m["moe"]
    assert (moe["num_experts"], moe["top_k"], moe["moe_intermediate_size"]) == (512, 10, inter)
    assert moe["shared_intermediate_size"] == inter and moe["shared_expert_gate"] is True
