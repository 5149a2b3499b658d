"""Properties of the Kimi K3 numpy references (tests/k3_reference.py) that follow from the
architecture (docs/K3.md), so that the references, and later the engine checked against them,
cannot drift from it unnoticed."""

from __future__ import annotations

import numpy as np
import pytest
from k3_reference import (
    LatentMoe,
    attn_res_forward,
    decay_gate,
    kda_step,
    res_mix,
    rms,
    sigmoid,
    situ,
)

RNG = np.random.default_rng(21)


def _silu(x):
    return x * sigmoid(x)


def test_situ_is_silu_glu_with_a_soft_clip():
    a, b = RNG.standard_normal((2, 1000)) * 4
    # β → ∞ and no linear clip: SwiGLU
    np.testing.assert_allclose(situ(a, b, 1e6, 0.0), _silu(a) * b, rtol=1e-9, atol=1e-12)
    # the gate branch is bounded by β, the up branch by λ when λ > 0
    assert np.all(np.abs(situ(a, np.ones_like(a), 1.5, 0.0)) < 1.5)
    assert np.all(np.abs(situ(np.full_like(a, 50.0), b, 1.0, 0.75)) < 0.75)
    # λ = 0: linear in the up branch; the sign is sign(gate)·sign(up)
    np.testing.assert_allclose(situ(a, 3 * b, 2.0, 0.0), 3 * situ(a, b, 2.0, 0.0), rtol=1e-12)
    nz = (a != 0) & (b != 0)
    assert np.all(np.sign(situ(a, b, 2.0, 0.5))[nz] == (np.sign(a) * np.sign(b))[nz])


def test_bounded_decay_gate():
    z = np.tile(np.linspace(-40, 40, 801), (3, 1))  # the same inputs for three heads
    a_log = np.array([-1.0, 0.0, 2.0])
    g = decay_gate(z, a_log, -5.0)
    assert np.all(g <= 0) and np.all(g >= -5)        # every decay exp(g) in [e^-5, 1]
    inner = np.abs(z) < 4
    assert np.all(g[inner] < 0) and np.all(g[inner] > -5)
    assert np.all(np.diff(g, axis=1) <= 0)           # stronger input, stronger decay
    mid = decay_gate(np.zeros((3, 1)), a_log, -5.0)
    np.testing.assert_allclose(mid, -2.5)            # σ(0) = 1/2, whatever A
    # steeper with larger A_log: the same z moves further from the midpoint
    assert np.all(np.abs(g[2] + 2.5) >= np.abs(g[1] + 2.5))
    assert np.all(np.abs(g[1] + 2.5) >= np.abs(g[0] + 2.5))
    # Kimi-Linear's gate is unbounded below: not a clamped form of the K3 gate
    assert decay_gate(np.array([[40.0]]), np.array([0.0]), None)[0, 0] < -39


def test_kda_step_is_a_delta_rule_memory():
    h, d = 3, 8
    k = rms(RNG.standard_normal((h, d)), 0) / np.sqrt(d)  # unit vectors
    v, q = RNG.standard_normal((2, h, d))
    zero = np.zeros((h, d, d))
    # from an empty state: o = β (q·k) v
    o, s = kda_step(zero, q, k, v, np.zeros((h, d)), np.full(h, 0.5))
    np.testing.assert_allclose(o, 0.5 * np.sum(q * k, 1)[:, None] * v, rtol=1e-12)
    # β = 1 writes v exactly: reading with k returns v, whatever was stored before
    s0 = RNG.standard_normal((h, d, d))
    _, s1 = kda_step(s0, q, k, v, np.zeros((h, d)), np.ones(h))
    np.testing.assert_allclose(np.einsum("hkv,hk->hv", s1, k), v, atol=1e-12)
    # β = 0: only the per-key-channel decay acts
    g = decay_gate(RNG.standard_normal((h, d)), np.zeros(h), -5.0)
    _, s2 = kda_step(s0, q, k, v, g, np.zeros(h))
    np.testing.assert_allclose(s2, s0 * np.exp(g)[:, :, None], rtol=1e-12)


def _moe(d=24, latent=16, experts=7, inter=8, top_k=3, shared=True, norm=True, scale=2.5):
    r = RNG.standard_normal
    return LatentMoe(
        router=r((experts, d)), bias=r(experts) * 0.1, down=r((latent, d)) / 4,
        up=r((d, latent)) / 4, norm=(1 + 0.1 * r(latent)) if norm else None,
        experts=[(r((inter, latent)), r((inter, latent)), r((latent, inter)))
                 for _ in range(experts)],
        shared=(r((10, d)), r((10, d)), r((d, 10))) if shared else None,
        top_k=top_k, scale=scale, renormalize=True, beta=2.0, linear_beta=0.0, eps=1e-6)


def test_latent_moe_routes_on_the_full_width_input():
    moe, x = _moe(), RNG.standard_normal(24)
    ids, w = moe.route(x)
    moe.down = RNG.standard_normal(moe.down.shape)  # the latent projection does not route
    ids2, _ = moe.route(x)
    assert ids.tolist() == ids2.tolist() and len(set(ids.tolist())) == 3
    np.testing.assert_allclose(w.sum(), moe.scale)  # renormalised, then scaled
    # the bias picks experts but does not weigh them
    moe.bias = np.zeros(7)
    moe.bias[int(np.argmin(sigmoid(moe.router @ x)))] = 10.0
    ids3, w3 = moe.route(x)
    s = sigmoid(moe.router @ x)
    np.testing.assert_allclose(w3, s[ids3] / s[ids3].sum() * moe.scale)


def test_latent_moe_norm_makes_the_routed_scale_irrelevant():
    """The RMSNorm sits after the weighted sum: the routed branch's overall scale (the routed
    scaling factor) cancels, unlike in DeepSeek-V3's MoE."""
    x = RNG.standard_normal(24)
    moe = _moe(shared=False)
    out = moe(x)
    moe.scale = 7.0
    np.testing.assert_allclose(moe(x), out, rtol=1e-6)


def test_latent_moe_with_identity_projections_is_a_normed_plain_moe():
    d = 16
    moe = _moe(d=d, latent=d, shared=False, norm=False)
    moe.down, moe.up = np.eye(d), np.eye(d)
    x = RNG.standard_normal(d)
    ids, w = moe.route(x)
    plain = sum(wj * moe.experts[j][2] @ situ(moe.experts[j][0] @ x, moe.experts[j][1] @ x,
                                              2.0, 0.0) for j, wj in zip(ids, w, strict=True))
    np.testing.assert_allclose(moe(x), rms(plain, 1e-6), rtol=1e-12)


def test_res_mix_is_a_convex_combination_scored_on_normed_sources():
    d = 12
    c, b1, b2 = RNG.standard_normal((3, d))
    score = RNG.standard_normal(d)
    assert res_mix(c, [], score, 1e-6) is c
    np.testing.assert_allclose(res_mix(c, [b1, b2], np.zeros(d), 1e-6), (c + b1 + b2) / 3)
    # weights depend on directions only: scaling a source scales its term, not its weight
    m1 = res_mix(c, [b1, b2], score, 0.0)
    m2 = res_mix(c, [4 * b1, b2], score, 0.0)
    np.testing.assert_allclose(m2 - m1, 3 * b1 * _weight(c, [b1, b2], score, 0), rtol=1e-9)


def _weight(c, bank, score, i):
    logits = rms(np.stack([*bank, c]), 0.0) @ score
    p = np.exp(logits - logits.max())
    return (p / p.sum())[i]


@pytest.mark.parametrize("layers,block", [(7, 3), (13, 12), (5, 12)])
def test_attn_res_bank_holds_the_embedding_and_each_blocks_sum(layers, block):
    """The bank is [embedding, sum of block 0's sublayer outputs, block 1's, ...]: a new block
    restarts the stream from its first attention output (kimi-k3.cpp's `banked`)."""
    d = 10
    outputs: list[tuple[int, np.ndarray]] = []
    mats = RNG.standard_normal((layers, 2, d, d)) / np.sqrt(d)

    def sub(kind):
        def f(layer, x):
            y = np.tanh(mats[layer, kind] @ rms(x, 1e-6))
            outputs.append((layer, y))
            return y
        return f

    emb = RNG.standard_normal(d)
    scores = RNG.standard_normal((layers, 2, d))
    final, bank = attn_res_forward(emb, sub(0), sub(1), scores, RNG.standard_normal(d), block,
                                   1e-6)
    assert len(bank) == -(-layers // block)
    np.testing.assert_array_equal(bank[0], emb)
    for i, banked in enumerate(bank[1:]):
        block_sum = sum(y for layer, y in outputs if layer // block == i)
        np.testing.assert_allclose(banked, block_sum, rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(final))
