"""Tiny synthetic containers with deterministic bytes, for tests, vectors and demos of the format.

Weights are pseudo-random (BLAKE3 XOF of a seed and the tensor name), so output is byte-identical
on every machine; codes need not be meaningful, but every float is finite and padding is zero.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import blake3
import numpy as np
from moepack.format.codecs import rvq_tile_codes
from moepack.format.layout import BankSpec, BlobSpec, ContainerSpec, TensorSpec, pack_record
from moepack.format.layout import plan_layout as _plan
from moepack.format.limits import align_up
from moepack.format.writer import ContainerWriter

RVQ3 = {"dim": 8, "entries": 256, "name": "rvq", "stages": 3}
F32, F16, Q8 = {"name": "f32"}, {"name": "f16"}, {"name": "q8", "group_size": 32}


def xof(seed: str, n: int) -> bytes:
    """n deterministic pseudo-random bytes for `seed`."""
    return blake3.blake3(seed.encode()).digest(length=n)


def _floats(seed: str, n: int, scale: float) -> np.ndarray:
    u = np.frombuffer(xof(seed, 2 * n), dtype="<u2").astype(np.float32)
    return (u / np.float32(65535.0) - np.float32(0.5)) * np.float32(2 * scale)


def encode_synthetic(codec: dict, shape: tuple[int, ...], seed: str) -> bytes:
    """Valid-looking bytes of `shape` under `codec` (f32, f16, bf16, q8, q6, rvq)."""
    name, n = codec["name"], int(np.prod(shape))
    if name in ("f32", "f16"):
        return _floats(seed, n, 0.1).astype("<f4" if name == "f32" else "<f2").tobytes()
    if name == "bf16":
        return (_floats(seed, n, 0.1).view("<u4") >> 16).astype("<u2").tobytes()
    rows, cols = shape
    if name == "q8":
        g = codec["group_size"]
        cols_p = align_up(cols, g)
        scales = np.abs(_floats(seed + ":s", rows * (cols_p // g), 0.01)).astype("<f2")
        q = np.zeros((rows, cols_p), dtype=np.int8)
        q[:, :cols] = np.frombuffer(xof(seed, rows * cols), np.int8).reshape(rows, cols)
        return scales.tobytes() + q.tobytes()
    if name == "q6":  # codes from the XOF, padding columns code 32 (weight 0)
        g = codec["group_size"]
        cols_p = align_up(cols, g)
        scales = np.abs(_floats(seed + ":s", rows * (cols_p // g), 0.01)).astype("<f2")
        k = np.full((rows, cols_p), 32, np.uint32)
        k[:, :cols] = np.frombuffer(xof(seed, rows * cols), np.uint8).reshape(rows, cols) & 63
        k = k.reshape(rows, cols_p // 4, 4)
        u = k[..., 0] | k[..., 1] << 6 | k[..., 2] << 12 | k[..., 3] << 18
        packed = np.stack([u & 255, u >> 8 & 255, u >> 16], axis=-1).astype(np.uint8)
        return scales.tobytes() + packed.tobytes()
    if name == "rvq":  # codes from the XOF in 64-row tiles (padding rows code 0)
        nv, st = -(-cols // codec["dim"]), codec["stages"]
        codes = np.frombuffer(xof(seed, rows * nv * st), np.uint8).reshape(rows, nv, st)
        scales = np.abs(_floats(seed + ":s", rows, 0.05)).astype("<f2")
        return rvq_tile_codes(codes).tobytes() + scales.tobytes()
    raise ValueError(f"synthetic bytes for codec {name!r} are not implemented")


def mixtral_manifest(*, layers: int, experts: int, hidden: int, inter: int, vocab: int,
                     heads: int, kv_heads: int, codecs: dict[str, dict]) -> dict[str, Any]:
    """A complete FORMAT.md section 6/7 manifest for a tiny Mixtral-shaped model."""
    head_dim = hidden // heads
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_local_experts": experts, "num_experts_per_tok": 2,
        "vocab_size": vocab, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2,
    }
    model = {
        "arch": "mixtral", "vocab_size": vocab, "hidden_size": hidden, "num_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "rope_scaling": None,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "qk_norm": False,
        "attention": {"kind": "gqa"}, "layer_kinds": ["moe"] * layers,
        "dense_intermediate_size": None,
        "moe": {"num_experts": experts, "top_k": 2, "moe_intermediate_size": inter,
                "scoring": "softmax", "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
                "routed_scaling_factor": 1.0, "num_shared_experts": 0,
                "shared_intermediate_size": None},
        "bos_token_id": 1, "eos_token_id": 2,
    }
    return {
        "model": model,
        "source": {"architecture": "MixtralForCausalLM", "config": config, "files": [
            {"name": "model.safetensors", "sha256": xof("source", 32).hex(), "size": 123456}]},
        "converter": {"name": "moepack.format.synthetic", "version": "1",
                      "settings": {"alignment": None, "codecs": codecs, "seed": 0}},
        "codecs": codecs,
    }


def mixtral_spec(*, layers: int = 2, experts: int = 4, hidden: int = 64, inter: int = 32,
                 vocab: int = 128, heads: int = 4, kv_heads: int = 2, alignment: int = 4096,
                 attn: dict = Q8, embed: dict = F16, expert: dict = RVQ3, codebook: dict = F32,
                 blobs: Mapping[str, tuple[int, str, int]] = ()) -> ContainerSpec:
    """ContainerSpec of a tiny Mixtral; `blobs` maps name -> (length, compression, raw_length)."""
    codecs = {"attn": attn, "embed": embed, "lm_head": embed, "norm": F32, "router": F32,
              "expert": expert, "codebook": codebook}
    manifest = mixtral_manifest(layers=layers, experts=experts, hidden=hidden, inter=inter,
                                vocab=vocab, heads=heads, kv_heads=kv_heads, codecs=codecs)
    manifest["converter"]["settings"]["alignment"] = alignment
    hd = hidden // heads
    t = [TensorSpec("embed", "embed", (vocab, hidden), embed)]
    for L in range(layers):
        p = f"layers.{L}."
        t += [TensorSpec(p + "attn_norm", "norm", (hidden,), F32),
              TensorSpec(p + "attn.q", "attn", (heads * hd, hidden), attn),
              TensorSpec(p + "attn.k", "attn", (kv_heads * hd, hidden), attn),
              TensorSpec(p + "attn.v", "attn", (kv_heads * hd, hidden), attn),
              TensorSpec(p + "attn.o", "attn", (hidden, heads * hd), attn),
              TensorSpec(p + "ffn_norm", "norm", (hidden,), F32),
              TensorSpec(p + "router", "router", (experts, hidden), F32)]
        if expert["name"] == "rvq":
            cb = (expert["stages"], expert["entries"], expert["dim"])
            t += [TensorSpec(f"{p}experts.{q}.codebook", "codebook", cb, codebook)
                  for q in ("gate", "up", "down")]
    t += [TensorSpec("final_norm", "norm", (hidden,), F32),
          TensorSpec("lm_head", "lm_head", (vocab, hidden), embed)]
    parts = (TensorSpec("gate", "expert", (inter, hidden), expert),
             TensorSpec("up", "expert", (inter, hidden), expert),
             TensorSpec("down", "expert", (hidden, inter), expert))
    banks = tuple(BankSpec(L, experts, parts) for L in range(layers))
    blob_specs = tuple(BlobSpec(n, ln, c, r) for n, (ln, c, r) in dict(blobs).items())
    return ContainerSpec(manifest, tuple(t), banks, blob_specs, alignment)


def write_synthetic(path: str | os.PathLike, spec: ContainerSpec,
                    blobs: Mapping[str, bytes] | None = None, *, seed: str = "moepack",
                    overwrite: bool = False, random_experts: bool = False) -> str:
    """Plan and write `spec` with deterministic payloads; blob bytes come from `blobs`.

    random_experts: expert records get os.urandom bytes instead (much faster for large records;
    for I/O tests and benchmarks that never decode them)."""
    layout = _plan(spec)
    with ContainerWriter(path, layout, overwrite=overwrite) as w:
        for t in spec.tensors:
            w.write_tensor(t.name, encode_synthetic(t.codec, t.shape, f"{seed}:{t.name}"))
        for b in spec.blobs:
            w.write_blob(b.name, (blobs or {})[b.name])
        for bank in layout.banks():
            for e in range(bank.count):
                parts = {p.name: os.urandom(p.length) if random_experts else
                         encode_synthetic(p.codec, p.shape, f"{seed}:{bank.layer}:{e}:{p.name}")
                         for p in bank.parts}
                w.write_expert(bank.layer, e, pack_record(bank, parts))
        return w.finalize()
