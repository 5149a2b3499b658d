"""The README's table of supported real checkpoints, computed by the converter's planner from
the config.json files beside this script (written from the published model cards; no weights).

    .venv/bin/python docs/configs/supported_models.py      # prints the Markdown rows

tests/test_supported_models.py checks that README.md holds exactly these rows."""

from __future__ import annotations

import json
from math import prod
from pathlib import Path

from moepack.convert.plan import plan_for_config
from moepack.convert.settings import Settings

HERE = Path(__file__).parent
# file stem -> the published names it stands for (same architecture and sizes)
MODELS = {
    # these two written from memory of the published config.json (no hub access here); the
    # planner's totals match the cards (46.7 B / 12.9 B, 235 B / 22 B)
    "Mixtral-8x7B": "Mixtral-8x7B",
    "Qwen3-235B-A22B": "Qwen3-235B-A22B",
    "GLM-4.5": "GLM-4.5",
    "GLM-4.6": "GLM-4.6 / GLM-4.7",
    "GLM-4.5-Air": "GLM-4.5-Air",
    "GLM-5": "GLM-5",
    "DeepSeek-V3.2": "DeepSeek-V3.2",
    "MiniMax-M2": "MiniMax-M2 / M2.1",
    "Kimi-K2.5": "Kimi K2.5 / K2.6",
    "Kimi-Linear-48B-A3B": "Kimi-Linear 48B-A3B",
    "Qwen3-Next-80B-A3B": "Qwen3-Next-80B-A3B",
    # text model only (the vision tower is skipped); the MTP layer is not converted
    "Qwen3.5-397B-A17B": "Qwen3.5-397B-A17B",
    # sizes the model card leaves open are assumed (docs/K3.md)
    "Kimi-K3": "Kimi K3 (config partly assumed: docs/K3.md)",
}
HEADER = ("| model | arch | parameters converted (total / active per token) | expert bytes per "
          "token | container (default codecs) |\n|---|---|---|---|---|")


def row(stem: str) -> str:
    cfg = json.loads((HERE / f"{stem}.json").read_text())
    layout = plan_for_config(cfg, Settings())
    spec = layout.spec
    # what the engine runs: the multi-token-prediction sections are only in the file size
    trunk = sum(prod(t.shape) for t in spec.tensors if t.cls != "codebook" and t.kind == "tensor")
    moe = spec.manifest["model"]["moe"]
    per_expert = sum(prod(p.shape) for p in spec.banks[0].parts)
    layers = sum(1 for b in spec.banks if b.kind == "expert_bank")
    total = trunk + layers * int(moe["num_experts"]) * per_expert
    active = trunk + layers * int(moe["top_k"]) * per_expert
    record = layout.bank(spec.banks[0].layer).record_length
    read = layers * int(moe["top_k"]) * record
    model = spec.manifest["model"]
    return (f"| {MODELS[stem]}{_state(model)} | `{model['arch']}` | {total / 1e9:.0f} B / "
            f"{active / 1e9:.1f} B | {read / 2**20:.0f} MiB ({layers} layers × {moe['top_k']} "
            f"× {record / 2**20:.2f} MiB) | {layout.file_size / 1e9:.0f} GB |")


def _state(m: dict) -> str:
    """The linear-attention state a sequence keeps (conv inputs + recurrent matrices, f32)."""
    la, n = m.get("linear_attention"), (m.get("layer_attention") or []).count("linear")
    if not n:
        return ""
    if la["kind"] == "kda":
        heads, dk = la["num_heads"], la["head_dim"]
        dv, conv = dk, 3 * heads * dk
    else:
        heads, dk, dv = la["num_value_heads"], la["key_head_dim"], la["value_head_dim"]
        conv = 2 * la["num_key_heads"] * dk + heads * dv
    floats = conv * (la["conv_kernel_size"] - 1) + heads * dk * dv
    return f" (linear-attention state {n * 4 * floats / 2**20:.1f} MiB)"


def table() -> str:
    return "\n".join([HEADER, *(row(stem) for stem in MODELS)])


if __name__ == "__main__":
    print(table())
