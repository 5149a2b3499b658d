"""Hand-written checkpoints for the hostile-config tests: config.json and safetensors bytes built
here (no transformers), so each test can plant exactly one defect."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from hostile_snapshot import snapshot

MIXTRAL: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 16,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "num_local_experts": 2, "num_experts_per_tok": 1,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": None,
}
NORM = "model.layers.0.input_layernorm.weight"
EXPERT = "model.layers.0.block_sparse_moe.experts.1.w2.weight"
Tensor = tuple[str, tuple[int, ...], bytes]  # dtype, shape, raw little-endian bytes


def mixtral_tensors(seed: int = 0) -> dict[str, Tensor]:
    """Every tensor of the tiny MIXTRAL config, random f32."""
    rng = np.random.default_rng(seed)
    p = "model.layers.0"
    shapes = {"model.embed_tokens.weight": (16, 8), "lm_head.weight": (16, 8),
              "model.norm.weight": (8,), NORM: (8,), f"{p}.post_attention_layernorm.weight": (8,),
              f"{p}.self_attn.q_proj.weight": (8, 8), f"{p}.self_attn.k_proj.weight": (4, 8),
              f"{p}.self_attn.v_proj.weight": (4, 8), f"{p}.self_attn.o_proj.weight": (8, 8),
              f"{p}.block_sparse_moe.gate.weight": (2, 8)}
    for e in range(2):
        for w in ("w1", "w2", "w3"):
            shapes[f"{p}.block_sparse_moe.experts.{e}.{w}.weight"] = (8, 8)
    out = {}
    for name, shape in shapes.items():
        a = rng.standard_normal(shape).astype("<f4") * 0.1
        if len(shape) == 1:
            a += 1.0
        out[name] = ("F32", shape, a.tobytes())
    return out


def safetensors_bytes(tensors: dict[str, Tensor], header: dict | None = None) -> bytes:
    """A safetensors file; `header` replaces the generated header (raw JSON object) if given."""
    table, off = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        table[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    raw = json.dumps(header if header is not None else table).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(d for _, _, d in tensors.values())


def write_checkpoint(root: Path, config: dict | None = None,
                     tensors: dict[str, Tensor] | None = None) -> Path:
    """root/src with config.json and model.safetensors; returns root/src."""
    src = root / "src"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(config or MIXTRAL))
    (src / "model.safetensors").write_bytes(safetensors_bytes(tensors or mixtral_tensors()))
    return src


def convert_cli(src: Path, out: Path, *extra: str, vmem_kb: int | None = None,
                timeout: float = 60) -> tuple[int, str]:
    """`python -m moepack convert SRC OUT` (under `ulimit -v vmem_kb` when given)."""
    cmd = [sys.executable, "-m", "moepack", "convert", "-q", *extra, str(src), str(out)]
    if vmem_kb is not None:
        cmd = ["bash", "-c", f'ulimit -v {vmem_kb}; exec "$@"', "bash", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "400"})
    return r.returncode, r.stdout + r.stderr


def assert_nothing_created(root: Path, before: dict, out: Path) -> None:
    """No OUT, OUT.partial or OUT.journal, and the folder tree exactly as before."""
    for p in (out, Path(f"{out}.partial"), Path(f"{out}.journal")):
        assert not os.path.lexists(p), p
    assert snapshot(root) == before
