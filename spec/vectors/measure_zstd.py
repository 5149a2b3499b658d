"""Measure where zstd pays for container sections (numbers quoted in spec/FORMAT.md section 4.2).

    python spec/vectors/measure_zstd.py TOKENIZER_JSON [SAFETENSORS]

Trains nothing and downloads nothing: give it a tokenizer.json you have (a larger one is built
from the Python standard library's sources with `--train-bpe N` if `tokenizers` is installed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import zstandard


def _best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(label: str, data: bytes, levels: tuple[int, ...] = (3, 19)) -> None:
    for level in levels:
        c = zstandard.ZstdCompressor(level=level)
        comp = c.compress(data)
        t_c = _best(lambda c=c: c.compress(data), 1 if level > 9 else 3)
        d = zstandard.ZstdDecompressor()
        t_d = _best(lambda d=d, comp=comp: d.decompress(comp))
        print(f"{label:38s} {len(data):>11,d} B  level {level:2d}: {len(comp):>11,d} B "
              f"({len(comp) / len(data):6.1%})  compress {t_c * 1e3:8.1f} ms  "
              f"decompress {t_d * 1e3:6.1f} ms")


def train_bpe(vocab: int) -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    files = sorted(str(p) for p in Path(sys.prefix, "lib").rglob("*.py"))[:3000]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>"],
                                         show_progress=False))
    return tok.to_str(pretty=True).encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer", nargs="?")
    ap.add_argument("safetensors", nargs="?")
    ap.add_argument("--train-bpe", type=int, default=0)
    a = ap.parse_args()
    if a.tokenizer:
        measure(f"tokenizer.json ({Path(a.tokenizer).parent.name})", Path(a.tokenizer).read_bytes())
    if a.train_bpe:
        measure(f"tokenizer.json (BPE {a.train_bpe} trained here)", train_bpe(a.train_bpe))
    if a.safetensors:
        import torch
        from safetensors.torch import load_file  # numpy has no bfloat16

        tensors = load_file(a.safetensors)
        big = max(tensors.values(), key=lambda t: t.numel() * t.element_size())
        raw = big.contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes()
        measure(f"largest tensor ({big.dtype}, {list(big.shape)})", raw, (3,))
    codes = np.random.default_rng(0).integers(0, 256, 1 << 22, dtype=np.uint8).tobytes()
    measure("uniform random bytes (like RVQ codes)", codes, (3,))


if __name__ == "__main__":
    main()
