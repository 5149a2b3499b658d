"""A big synthetic MoE model with realistic shapes, as a moepack container and as its GGUF twin.

    python -m bench.synthetic_model --size-gb 10 --dir bench/out [--no-gguf]

Shapes are Qwen3-235B-A22B's experts (hidden 4096, moe_intermediate 1536, 128 experts per layer,
top-8, 32 query / 4 KV heads of 128) on a Mixtral-style decoder (softmax router, top-k
renormalised, no shared expert), which both engines run: moepack as `mixtral`, llama.cpp as arch
`llama` with `ffn_{gate,up,down}_exps`. The number of layers is chosen for the target size.
Speed does not depend on the values, so every weight is random; the structure is real.

| part | moepack | GGUF twin |
|---|---|---|
| routed experts | rvq: 3 stages x 256 entries, 8-dim, f16 row scale (3.0 bpw) | IQ3_XXS (3.06) |
| attention, embedding, lm_head | q8, groups of 32 (8.5 bpw) | Q8_0 (8.5 bpw) |
| norms, router | f32 | f32 |

The GGUF twin carries a placeholder SentencePiece vocabulary (byte tokens + `tok<i>`) so
llama.cpp loads it; both engines are fed the same token ids, never text.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from moepack.format.layout import plan_layout
from moepack.format.synthetic import Q8, RVQ3, mixtral_spec, write_synthetic

IQ3_XXS_BLOCK = (256, 98)  # weights, bytes: f16 d + 64 grid indices + 32 bytes of signs/scales
Q3_K_BLOCK = (256, 110)    # hmask[32] + qs[64] + scales[12] + f16 d (at byte 108)
Q8_0_BLOCK = (32, 34)      # f16 d + 32 int8
# expert type -> (block, offset of the f16 scale in a block, llama_ftype, bits per weight)
EXPERT_TYPES = {"IQ3_XXS": (IQ3_XXS_BLOCK, 0, 23, 3.0625), "Q3_K": (Q3_K_BLOCK, 108, 11, 3.4375)}


@dataclass(frozen=True)
class Shape:
    hidden: int = 4096
    inter: int = 1536
    experts: int = 128
    top_k: int = 8
    layers: int = 11
    vocab: int = 32000
    heads: int = 32
    kv_heads: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def expert_params(self) -> int:
        return 3 * self.hidden * self.inter

    def rvq_record_bytes(self, align: int = 4096) -> int:
        """One moepack expert record: codes (3 stages, 1 byte per 8 weights) in 64-row tiles
        + f16 row scales, per part, parts 64-aligned, record aligned to `align`."""
        def part(rows: int, cols: int) -> int:
            return -(-rows // 64) * 64 * -(-cols // 8) * 3 + rows * 2
        total = 0
        for rows, cols in ((self.inter, self.hidden), (self.inter, self.hidden),
                           (self.hidden, self.inter)):
            total = -(-total // 64) * 64 + part(rows, cols)
        return -(-total // align) * align

    def gguf_expert_bytes(self) -> int:
        w, b = IQ3_XXS_BLOCK
        return self.expert_params() // w * b

    def trunk_params(self) -> int:
        attn = self.hidden * (2 * self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim)
        return 2 * self.vocab * self.hidden + self.layers * (attn + self.experts * self.hidden)

    def approx_bytes(self) -> int:
        """Approximate container size (trunk at q8, experts as rvq records)."""
        return int(self.trunk_params() * 1.0625) + self.layers * self.experts * \
            self.rvq_record_bytes()


def shape_for_size(size_gb: float, *, experts: int = 128, vocab: int = 32000,
                   min_layers: int = 2) -> Shape:
    """The Qwen3-235B-shaped model with as many layers as fit `size_gb` (at least min_layers)."""
    s = Shape(experts=experts, vocab=vocab, layers=1)
    per_layer = Shape(experts=experts, vocab=vocab, layers=2).approx_bytes() - s.approx_bytes()
    base = s.approx_bytes() - per_layer
    layers = max(min_layers, round((size_gb * 1e9 - base) / per_layer))
    return Shape(experts=experts, vocab=vocab, layers=layers)


def write_moepack(path: Path, s: Shape) -> dict:
    spec = mixtral_spec(layers=s.layers, experts=s.experts, hidden=s.hidden, inter=s.inter,
                        vocab=s.vocab, heads=s.heads, kv_heads=s.kv_heads, attn=Q8, embed=Q8,
                        expert=RVQ3)
    spec.manifest["model"]["moe"]["top_k"] = s.top_k
    spec.manifest["source"]["config"]["num_experts_per_tok"] = s.top_k
    t0 = time.perf_counter()
    write_synthetic(path, spec, overwrite=True)
    return {"path": str(path), "bytes": path.stat().st_size, "seconds": time.perf_counter() - t0,
            "record_bytes": plan_layout(spec).banks()[0].stride}


def _blocks(rng: np.random.Generator, n_weights: int, block: tuple[int, int], d: float,
            d_at: int = 0) -> np.ndarray:
    """Random quant blocks (uint8) with a fixed small f16 scale so every value stays finite."""
    w, b = block
    n = n_weights // w
    a = np.frombuffer(rng.bytes(n * b), dtype=np.uint8).reshape(n, b).copy()
    a[:, d_at:d_at + 2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    return a.reshape(-1)


def write_gguf(path: Path, s: Shape, seed: int = 0, expert_type: str = "IQ3_XXS") -> dict:
    """The llama.cpp twin: same shapes, IQ3_XXS (or Q3_K) experts, Q8_0 trunk, written tensor by
    tensor."""
    import gguf
    from gguf import GGMLQuantizationType as T

    eblock, e_d_at, ftype, _ = EXPERT_TYPES[expert_type]

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("moepack-bench-synthetic")
    w.add_context_length(4096)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.inter)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.top_k)
    w.add_vocab_size(s.vocab)
    w.add_file_type(ftype)  # LLAMA_FTYPE_MOSTLY_IQ3_XXS / Q3_K_S
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"tok{i}" for i in range(len(tokens), s.vocab)]
    types = [2, 3, 3] + [6] * 256 + [1] * (s.vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * s.vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    hd, H = s.head_dim, s.hidden
    # (name, numpy-order logical shape, kind): kind q8 / iq3 / f32
    plan: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (s.vocab, H), "q8")]
    for L in range(s.layers):
        p = f"blk.{L}."
        plan += [(p + "attn_norm.weight", (H,), "f32"),
                 (p + "attn_q.weight", (s.heads * hd, H), "q8"),
                 (p + "attn_k.weight", (s.kv_heads * hd, H), "q8"),
                 (p + "attn_v.weight", (s.kv_heads * hd, H), "q8"),
                 (p + "attn_output.weight", (H, s.heads * hd), "q8"),
                 (p + "ffn_norm.weight", (H,), "f32"),
                 (p + "ffn_gate_inp.weight", (s.experts, H), "f32"),
                 (p + "ffn_gate_exps.weight", (s.experts, s.inter, H), "iq3"),
                 (p + "ffn_up_exps.weight", (s.experts, s.inter, H), "iq3"),
                 (p + "ffn_down_exps.weight", (s.experts, H, s.inter), "iq3")]
    plan += [("output_norm.weight", (H,), "f32"), ("output.weight", (s.vocab, H), "q8")]
    kinds = {"q8": (T.Q8_0, Q8_0_BLOCK), "iq3": (getattr(T, expert_type), eblock)}
    for name, shape, kind in plan:
        if kind == "f32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            qt, (bw, bb) = kinds[kind]
            byte_shape = (*shape[:-1], shape[-1] // bw * bb)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                              raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in plan:
        n = int(np.prod(shape))
        if kind == "f32":
            if name.endswith("norm.weight"):
                a = np.ones(n, dtype=np.float32)
            else:
                a = ((rng.random(n, dtype=np.float32) - 0.5) * 0.2).astype(np.float32)
        elif kind == "q8":
            a = _blocks(rng, n, Q8_0_BLOCK, 2e-4)
        else:
            a = _blocks(rng, n, eblock, 1e-4, d_at=e_d_at)
        w.write_tensor_data(a)
    w.close()
    return {"path": str(path), "bytes": path.stat().st_size, "seconds": time.perf_counter() - t0,
            "expert_type": expert_type,
            "expert_bytes": s.expert_params() // eblock[0] * eblock[1]}


def build(dir_: Path, s: Shape, *, gguf: bool = True) -> dict:
    dir_.mkdir(parents=True, exist_ok=True)
    out = {"shape": asdict(s), "moepack": write_moepack(dir_ / "synthetic.moepack", s)}
    if gguf:
        out["gguf"] = write_gguf(dir_ / "synthetic.gguf", s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=10.0)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dir", type=Path, default=Path("bench/out"))
    ap.add_argument("--no-gguf", action="store_true")
    a = ap.parse_args()
    s = shape_for_size(a.size_gb, experts=a.experts, vocab=a.vocab)
    print(json.dumps(build(a.dir, s, gguf=not a.no_gguf)))


if __name__ == "__main__":
    main()
