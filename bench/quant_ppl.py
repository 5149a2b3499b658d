"""Held-out loss of the demo model with quantised weights (used by bench/quant.py).

Each variant replaces weights of the bf16 demo model by decode(encode(W)) under some codec, then
measures the mean next-token loss on demo/heldout.txt (blocks of 256 tokens). This measures what
the relative weight error means for the model, which weight error alone does not tell.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from moepack.convert.quant import TRUNK_CODECS, encode, expert_settings, train_layer
from moepack.format.codecs import decode

SEQ = 256


def _load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    return model.eval(), tok


def _blocks(tok, text: str, bos: int | None) -> torch.Tensor:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ids = ([bos] if bos is not None else []) + ids
    n = (len(ids) - 1) // SEQ
    t = torch.tensor(ids[: n * SEQ + 1])
    return torch.stack([t[i * SEQ : i * SEQ + SEQ + 1] for i in range(n)])


@torch.no_grad()
def _loss(model, blocks: torch.Tensor) -> float:
    total, count = 0.0, 0
    for b in blocks.split(8):
        logits = model(b[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += b[:, 1:].numel()
    return total / count


def _expert_views(layer) -> dict[str, list[torch.Tensor]]:
    """gate/up/down weight views [out, in] per expert (transformers 5 fuses them in 3-D params)."""
    ex = layer.mlp.experts
    inter = ex.down_proj.shape[2]
    return {
        "gate": [ex.gate_up_proj.data[e, :inter] for e in range(ex.num_experts)],
        "up": [ex.gate_up_proj.data[e, inter:] for e in range(ex.num_experts)],
        "down": [ex.down_proj.data[e] for e in range(ex.num_experts)],
    }


def _quantise_experts(model, preset: str) -> None:
    st = expert_settings(preset)
    for li, layer in enumerate(model.model.layers):
        for pi, (part, views) in enumerate(_expert_views(layer).items()):
            ws = [v.numpy().astype(np.float32) for v in views]
            codec, cb, signs = train_layer(lambda e, ws=ws: ws[e], len(ws), ws[0].shape, st,
                                           seed=li * 3 + pi, part=part)
            for v, w in zip(views, ws, strict=True):
                data = encode(codec, w, codebook=cb, rotation=signs, settings=st)
                v.copy_(torch.from_numpy(decode(codec, w.shape, data, codebook=cb,
                                                rotation=signs)))


def _quantise_trunk(model, codec_name: str, kinds: tuple[str, ...]) -> None:
    codec = TRUNK_CODECS[codec_name]
    for name, p in model.named_parameters():
        is_attn = ".self_attn." in name and name.endswith(".weight")
        is_embed = name.endswith("embed_tokens.weight")
        if (is_attn and "attn" in kinds) or (is_embed and "embed" in kinds):
            w = p.detach().numpy().astype(np.float32)
            with torch.no_grad():
                p.copy_(torch.from_numpy(decode(codec, w.shape, encode(codec, w))))


VARIANTS: dict[str, tuple[str | None, tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "bf16 (reference)": (None, ()),
    "experts rvq3-baseline": ("rvq3-baseline", ()),
    "experts rvq3": ("rvq3", ()),
    "experts rvq3-hadamard": ("rvq3-hadamard", ()),
    "experts rvq4": ("rvq4", ()),
    "attn q4 only": (None, (("q4", ("attn",)),)),
    "attn q4-zp only": (None, (("q4-zp", ("attn",)),)),
    "attn q8 only": (None, (("q8", ("attn",)),)),
    "rvq3 + attn q8 + embed q8": ("rvq3", (("q8", ("attn", "embed")),)),
    "rvq3 + attn q4 + embed q8": ("rvq3", (("q4", ("attn",)), ("q8", ("embed",)))),
}


def heldout_table(model_dir: Path, text_path: Path) -> list[str]:
    """Markdown rows: variant | held-out loss | perplexity | Δ loss vs bf16."""
    model, tok = _load(model_dir)
    blocks = _blocks(tok, text_path.read_text(), tok.bos_token_id)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rows, ref = [], None
    for name, (preset, trunk) in VARIANTS.items():
        model.load_state_dict(state)
        if preset:
            _quantise_experts(model, preset)
        for codec_name, kinds in trunk:
            _quantise_trunk(model, codec_name, kinds)
        loss = _loss(model, blocks)
        ref = loss if ref is None else ref
        rows.append(f"| {name} | {loss:.4f} | {math.exp(loss):.2f} | {loss - ref:+.4f} |")
        print(rows[-1], flush=True)
    return [f"{blocks.shape[0]} blocks × {SEQ} tokens of demo/heldout.txt.", "",
            "| weights | held-out loss | perplexity | Δ loss |", "|---|---:|---:|---:|", *rows]
