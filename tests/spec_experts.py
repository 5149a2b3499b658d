"""The engine's expert numerics in transformers' reference models: routed experts computed from
the container's stored codes instead of the float weights, so a comparison measures the engine's
forward pass, not the codec's error.  As the engine does (docs/RUNTIME.md), a forward call over
several tokens (a prompt) takes CODECS.md §3.6's prefill product and a one-token call (a decode
step) §3.5's table product."""

from __future__ import annotations

import numpy as np
import torch
from moepack.format.reader import Container
from moepack.format.rvq_matvec import rvq_gemm, rvq_matvec


class LayerExperts:
    """One MoE layer's routed experts as stored: codes, codebooks, rotations (copied out)."""

    def __init__(self, c: Container, layer: int) -> None:
        bank = c.bank(layer)
        self.count = bank["count"]
        self.parts = {p["name"]: (p["codec"], tuple(p["shape"])) for p in bank["parts"]}
        self.data = {(e, part): bytes(c.expert_part_bytes(layer, e, part))
                     for e in range(self.count) for part in self.parts}
        self.refs = {}
        for part in self.parts:
            rot = f"layers.{layer}.experts.{part}.rotation"
            self.refs[part] = (c.tensor(f"layers.{layer}.experts.{part}.codebook"),
                               c.tensor(rot) if rot in c.tensor_names() else None)

    def product(self, expert: int, part: str, x: np.ndarray, prefill: bool) -> np.ndarray:
        """x [n, cols] through the part: §3.6 for a prefill call, else §3.5"""
        codec, shape = self.parts[part]
        cb, rot = self.refs[part]
        return (rvq_gemm if prefill else rvq_matvec)(codec, shape, self.data[(expert, part)], cb,
                                                     x, rot)


def spec_experts_forward(module: torch.nn.Module, layer: LayerExperts):
    """A drop-in `forward(hidden_states, top_k_index, top_k_weights)` of transformers' *Experts
    modules (Mixtral, Qwen3-MoE, DeepSeek-V3 share it): down(act(gate x) * up x) per routed
    expert with the engine's products, weighted and summed per token."""
    def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states.detach().float().numpy()
        idx, wts = top_k_index.numpy(), top_k_weights.detach().float().numpy()
        out = torch.zeros_like(hidden_states)
        prefill = len(x) > 1
        for e in np.unique(idx):
            if e >= layer.count:  # transformers' "no expert" slot
                continue
            tok, pos = np.nonzero(idx == e)
            g = torch.from_numpy(layer.product(int(e), "gate", x[tok], prefill))
            u = torch.from_numpy(layer.product(int(e), "up", x[tok], prefill))
            h = (module.act_fn(g) * u).numpy()
            y = layer.product(int(e), "down", h, prefill) * wts[tok, pos, None]
            out.index_add_(0, torch.from_numpy(tok), torch.from_numpy(y).to(out.dtype))
        return out
    return forward


def use_spec_expert_numerics(ref: torch.nn.Module, path) -> None:
    """Patch every routed-experts module of `ref` to the engine's numerics (CODECS.md §3.5/3.6)."""
    patched = 0
    with Container.open(path) as c:
        banks = {b["layer"] for b in c.banks()}
        decoder = getattr(ref.model, "language_model", ref.model)  # Kimi K2.5: nested
        for i, block in enumerate(decoder.layers):
            for m in block.modules():
                if type(m).__name__.endswith("Experts") and hasattr(m, "gate_up_proj"):
                    m.forward = spec_experts_forward(m, LayerExperts(c, i))
                    patched += 1
                    assert i in banks, i
    assert patched == len(banks) > 0
