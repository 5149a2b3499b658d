"""A whole Kimi K3 forward pass in numpy (float64), written from docs/K3.md on the parts in
tests/k3_reference.py, over a checkpoint in the published layout: dense weights (what `moepack
export` writes) or the source's MXFP4 experts. The engine's logits are checked against it: there
is no K3 in transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from k3_reference import LatentMoe, kda_step, res_mix, rms, sigmoid, situ
from moepack.convert.mxfp4 import dequantize
from moepack.format.reader import Container
from safetensors.numpy import load_file
from spec_experts import LayerExperts
from spec_trunk import SpecTrunk, rounded


class SpecProjection:
    """One routed expert's projection as the engine computes a prompt's: CODECS.md §3.6 on the
    container's codes (`projection @ x`)."""

    def __init__(self, layer: LayerExperts, expert: int, part: str) -> None:
        self.layer, self.expert, self.part = layer, expert, part

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        y = self.layer.product(self.expert, self.part, np.asarray(x, np.float32)[None], True)
        return y[0].astype(np.float64)


class K3Forward:
    """`l2_eps`: KDA's q/k L2 norm eps (fla's 1e-6, as the engine; llama.cpp's K3 graph uses
    rms_norm_eps). With `container`, what the engine computes for a prompt: the routed experts
    are its codes under §3.6 instead of the checkpoint's dense weights, and the trunk products
    that take §2.4 round their activations as it does."""

    def __init__(self, directory: Path, l2_eps: float = 1e-6,
                 container: Path | None = None) -> None:
        self.l2_eps = l2_eps
        self.spec: dict[int, LayerExperts] | None = None
        if container is not None:
            with Container.open(container) as c:
                t = json.loads((directory / "config.json").read_text())["text_config"]
                self.spec = {layer: LayerExperts(c, layer)
                             for layer in range(t["first_k_dense_replace"], t["num_hidden_layers"])}
        cfg = json.loads((directory / "config.json").read_text())
        self.t = cfg["text_config"]
        raw: dict[str, np.ndarray] = {}
        for f in sorted(directory.glob("*.safetensors")):
            raw.update(load_file(f))
        self.w: dict[str, np.ndarray] = {}
        for k, v in raw.items():
            if k.endswith(".weight_scale"):
                continue
            if k.endswith(".weight_packed"):  # the source's MXFP4 experts, decoded exactly
                k = k.removesuffix("_packed")
                v = dequantize(v, raw[k + "_scale"], k)
            self.w[k.removeprefix("language_model.")] = v.astype(np.float64)
        t, la = self.t, self.t["linear_attn_config"]
        self.eps = float(t["rms_norm_eps"])
        self.full = {i - 1 for i in la["full_attn_layers"]}
        self.heads, self.dk = la["num_heads"], la["head_dim"]
        self.kconv = la["short_conv_kernel_size"]
        self.bound = la.get("gate_lower_bound")
        self.beta, self.lb = t["activation_situ_beta"], t.get("activation_situ_linear_beta", 0.0)

    def mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x [T, cols] times a grouped trunk matrix, as the engine multiplies it (§2.4)"""
        return (x if self.spec is None else rounded(x)) @ self.w[name].T

    def trunk(self, name: str) -> np.ndarray | SpecTrunk:
        """a trunk matrix for `matrix @ x` products, §2.4's with a container"""
        return self.w[name] if self.spec is None else SpecTrunk(self.w[name])

    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return rms(x, self.eps) * self.w[name]

    def score(self, pre: str) -> np.ndarray:
        return self.w[pre + "_norm.weight"] * self.w[pre + "_proj.weight"]

    def kda(self, p: str, x: np.ndarray) -> np.ndarray:
        """x [T, d] (normed) -> [T, d]."""
        w, h, dk, k = self.w, self.heads, self.dk, self.kconv
        T = x.shape[0]
        conv = []
        for name in "qkv":
            y = self.mm(x, f"{p}.{name}_proj.weight")                    # [T, h*dk]
            cw = w[f"{p}.{name}_conv1d.weight"].reshape(h * dk, k)
            pad = np.vstack([np.zeros((k - 1, h * dk)), y])
            out = sum(cw[:, j] * pad[j:j + T] for j in range(k))
            conv.append(out * sigmoid(out))                              # silu
        q, kk, v = (c.reshape(T, h, dk) for c in conv)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + self.l2_eps) / np.sqrt(dk)
        kk = kk / np.sqrt((kk * kk).sum(-1, keepdims=True) + self.l2_eps)
        z = self.mm(self.mm(x, f"{p}.f_a_proj.weight"), f"{p}.f_b_proj.weight") + w[f"{p}.dt_bias"]
        a = np.exp(w[f"{p}.A_log"].reshape(h))[None, :, None]
        g = self.bound * sigmoid(a * z.reshape(T, h, dk))
        beta = sigmoid(self.mm(x, f"{p}.b_proj.weight"))
        gate = sigmoid(self.mm(x, f"{p}.g_proj.weight")).reshape(T, h, dk)
        state, outs = np.zeros((h, dk, dk)), []
        for i in range(T):
            o, state = kda_step(state, q[i], kk[i], v[i], g[i], beta[i])
            outs.append((rms(o, self.eps) * w[f"{p}.o_norm.weight"] * gate[i]).reshape(-1))
        return self.mm(np.array(outs), f"{p}.o_proj.weight")

    def mla(self, p: str, x: np.ndarray) -> np.ndarray:
        """Without RoPE; the heads' output gated by sigmoid(g_proj x)."""
        w, t = self.w, self.t
        T, h = x.shape[0], t["num_attention_heads"]
        nope, rope, vd, r = (t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"],
                             t["kv_lora_rank"])
        q = self.norm(self.mm(x, f"{p}.q_a_proj.weight"), f"{p}.q_a_layernorm.weight")
        q = self.mm(q, f"{p}.q_b_proj.weight").reshape(T, h, nope + rope)
        ckv = self.mm(x, f"{p}.kv_a_proj_with_mqa.weight")
        c, k_pe = self.norm(ckv[:, :r], f"{p}.kv_a_layernorm.weight"), ckv[:, r:]
        kv = (c @ w[f"{p}.kv_b_proj.weight"].T).reshape(T, h, nope + vd)
        k = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe[:, None], (T, h, rope))], -1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(nope + rope)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", pr, kv[..., nope:]).reshape(T, h * vd)
        out = out * sigmoid(self.mm(x, f"{p}.g_proj.weight"))
        return self.mm(out, f"{p}.o_proj.weight")

    def ffn(self, layer: int, x: np.ndarray) -> np.ndarray:
        w, t = self.w, self.t
        p = f"model.layers.{layer}"
        if layer < t["first_k_dense_replace"]:
            m = f"{p}.mlp"
            gate, up = self.mm(x, f"{m}.gate_proj.weight"), self.mm(x, f"{m}.up_proj.weight")
            return self.mm(situ(gate, up, self.beta, self.lb), f"{m}.down_proj.weight")
        m = f"{p}.block_sparse_moe"
        moe = LatentMoe(
            router=w[f"{m}.gate.weight"], bias=w[f"{m}.gate.e_score_correction_bias"],
            down=self.trunk(f"{m}.routed_expert_down_proj.weight"),
            up=self.trunk(f"{m}.routed_expert_up_proj.weight"),
            norm=w[f"{m}.routed_expert_norm.weight"],
            experts=self._experts(layer, m),
            shared=tuple(self.trunk(f"{m}.shared_experts.{x_}_proj.weight")
                         for x_ in ("gate", "up", "down")),
            top_k=t["num_experts_per_token"], scale=t["routed_scaling_factor"],
            renormalize=t["moe_renormalize"], beta=self.beta, linear_beta=self.lb, eps=self.eps)
        return np.array([moe(row) for row in x])

    def _experts(self, layer: int, m: str) -> list:
        if self.spec is None:
            return [tuple(self.w[f"{m}.experts.{e}.{x_}.weight"] for x_ in ("w1", "w3", "w2"))
                    for e in range(self.t["num_experts"])]
        le = self.spec[layer]
        return [tuple(SpecProjection(le, e, part) for part in ("gate", "up", "down"))
                for e in range(le.count)]

    def logits(self, tokens: list[int]) -> np.ndarray:
        t, w = self.t, self.w
        x = w["model.embed_tokens.weight"][tokens]
        bank: list[np.ndarray] = []  # per layer-block, [T, d] for all tokens at once
        bs = t["attn_res_block_size"]

        def mix(cur: np.ndarray, score: np.ndarray) -> np.ndarray:
            return np.array([res_mix(cur[i], [b[i] for b in bank], score, self.eps)
                             for i in range(len(cur))])

        for layer in range(t["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            a = self.norm(mix(x, self.score(f"{p}.self_attention_res")),
                          f"{p}.input_layernorm.weight")
            banked = layer % bs == 0
            if banked:
                bank.append(x)
            o = self.mla(f"{p}.self_attn", a) if layer in self.full \
                else self.kda(f"{p}.self_attn", a)
            x = o if banked else x + o
            f = self.norm(mix(x, self.score(f"{p}.mlp_res")),
                          f"{p}.post_attention_layernorm.weight")
            x = x + self.ffn(layer, f)
        x = self.norm(mix(x, self.score("model.output_attn_res")), "model.norm.weight")
        return self.mm(x, "lm_head.weight")
