"""Numpy references for Kimi K3's new parts, written from docs/K3.md (llama.cpp's kimi-k3.cpp is
the implementation those equations were checked against): SiTU-GLU, the bounded KDA decay gate,
one KDA step, the latent MoE and block attention residuals (AttnRes). float64 throughout, one
token at a time; for tests of the engine and of the properties in tests/test_k3_reference.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Array = np.ndarray


def sigmoid(x: Array) -> Array:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, np.float64)))


def rms(x: Array, eps: float) -> Array:
    """x / sqrt(mean(x²) + eps) over the last axis (RMSNorm without its weight)."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def situ(gate: Array, up: Array, beta: float, linear_beta: float) -> Array:
    """SiTU-GLU: β·tanh(gate/β)·σ(gate) ⊙ (λ·tanh(up/λ) if λ > 0 else up)."""
    act = beta * np.tanh(gate / beta) * sigmoid(gate)
    if linear_beta > 0:
        up = linear_beta * np.tanh(up / linear_beta)
    return act * up


def decay_gate(z: Array, a_log: Array, lower_bound: float | None) -> Array:
    """KDA's per-channel log decay g for pre-activation z [heads, D] and A_log [heads]:
    K3 (lower_bound set): lb·σ(exp(A_log)·z); Kimi-Linear: -exp(A_log)·softplus(z)."""
    a = np.exp(np.asarray(a_log, np.float64))[:, None]
    if lower_bound is not None:
        return lower_bound * sigmoid(a * z)
    return -a * np.logaddexp(0.0, z)


def kda_step(state: Array, q: Array, k: Array, v: Array, g: Array,
             beta: Array) -> tuple[Array, Array]:
    """One token of the KDA recurrence per head (q, k already L2-normalised, q already scaled):
    S = diag(exp(g)) S; S += β·k (v - Sᵀk)ᵀ; o = Sᵀq. state [h, D, D] (key, value), q/k/v/g
    [h, D], beta [h]. Returns (o [h, D], new state)."""
    s = state * np.exp(g)[:, :, None]
    err = v - np.einsum("hkv,hk->hv", s, k)
    s = s + beta[:, None, None] * k[:, :, None] * err[:, None, :]
    return np.einsum("hkv,hk->hv", s, q), s


@dataclass
class LatentMoe:
    """One K3 MoE layer: router at full width, routed experts in the latent space, RMSNorm on
    their weighted sum, up-projection, shared experts at full width."""

    router: Array              # [E, d]
    bias: Array                # [E] e_score_correction_bias (selection only)
    down: Array                # [latent, d]
    up: Array                  # [d, latent]
    norm: Array | None         # [latent] routed_expert_norm, or None (llama.cpp: optional)
    experts: list[tuple[Array, Array, Array]]  # (w1 gate [I, latent], w3 up, w2 down [latent, I])
    shared: tuple[Array, Array, Array] | None  # (gate [S, d], up [S, d], down [d, S])
    top_k: int
    scale: float               # routed_scaling_factor
    renormalize: bool
    beta: float
    linear_beta: float
    eps: float

    def route(self, x: Array) -> tuple[Array, Array]:
        """(expert ids, weights): top-k of σ(router x) + bias; weights from the scores alone."""
        s = sigmoid(self.router @ x)
        ids = np.argsort(-(s + self.bias), kind="stable")[:self.top_k]
        w = s[ids] / s[ids].sum() if self.renormalize else s[ids]
        return ids, w * self.scale

    def ffn(self, gate: Array, up: Array, down: Array, x: Array) -> Array:
        return down @ situ(gate @ x, up @ x, self.beta, self.linear_beta)

    def __call__(self, x: Array) -> Array:
        ids, w = self.route(x)
        z = self.down @ x
        routed = sum(wj * self.ffn(*self.experts[j], z)
                     for j, wj in zip(ids, w, strict=True))
        routed = rms(routed, self.eps) * (1.0 if self.norm is None else self.norm)
        out = self.up @ routed
        if self.shared is not None:
            out = out + self.ffn(*self.shared, x)
        return out


def res_mix(current: Array, bank: list[Array], score: Array, eps: float) -> Array:
    """AttnRes mix of one token: softmax over the sources bank + [current] of
    Σ_i rms(v)_i·score_i, applied to the raw sources; `current` alone when the bank is empty."""
    if not bank:
        return current
    sources = np.stack([*bank, current])
    logits = rms(sources, eps) @ score
    p = np.exp(logits - logits.max())
    return (p / p.sum()) @ sources


Sublayer = Callable[[int, Array], Array]  # (layer, normed input) -> output


def attn_res_forward(embedding: Array, attn: Sublayer, ffn: Sublayer, scores: Array,
                     final_score: Array, block_size: int, eps: float) -> tuple[Array, list[Array]]:
    """The residual stream of one token through len(scores) layers with block attention
    residuals, as kimi-k3.cpp's graph computes it; the sublayers get the un-normed mix (they
    apply their own RMSNorm). scores [L, 2, d] (pre-attention, pre-FFN). Returns (the final
    mix, the bank)."""
    p, bank = np.asarray(embedding, np.float64), []
    for layer in range(len(scores)):
        a = res_mix(p, bank, scores[layer, 0], eps)
        banked = layer % block_size == 0
        if banked:
            bank.append(p)  # the raw stream, not the mix
        o = attn(layer, a)
        p = o if banked else p + o
        p = p + ffn(layer, res_mix(p, bank, scores[layer, 1], eps))
    return res_mix(p, bank, final_score, eps), bank
