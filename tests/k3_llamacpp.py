"""llama.cpp's own Kimi K3 code on a checkpoint, each step in its own process (it puts llama.cpp's
`conversion` and `gguf` packages on sys.path; a failed GGML_ASSERT aborts the process):

    python tests/k3_llamacpp.py convert LLAMA_CPP_DIR CHECKPOINT_DIR OUT.gguf [OUT.npz]
    python tests/k3_llamacpp.py logits MODEL.gguf TOKENS.npy THREADS OUT.npy [--one-by-one]

`convert` runs `KimiK3Model` of the llama.cpp sources vendored in llama-cpp-python's source
package to an F32 GGUF (routed experts stay MXFP4 when the checkpoint ships them so), with
llama.cpp's vocabulary-less stub ("no_vocab" and the vocab_size key: tiny test checkpoints have
no tokenizer, the ids are fed directly); OUT.npz gets every tensor name and the routed experts
dequantised by gguf-py. `logits` evaluates the GGUF with llama.cpp through the llama_cpp
bindings: every id in one batch (all logits), or one decode call per id, THREADS threads, f32
KV cache, no flash attention, and writes the float32 [tokens, vocab] logits."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def convert(lcpp: Path, src: Path, gguf_path: Path, npz: Path | None = None) -> None:
    sys.path[:0] = [str(lcpp), str(lcpp / "gguf-py")]
    import gguf
    from conversion import ModelBase, ModelType, load_all_models

    load_all_models()
    cls = ModelBase.from_model_architecture("KimiK3ForConditionalGeneration",
                                            model_type=ModelType.TEXT)
    cls.set_vocab = lambda self: self.gguf_writer.add_tokenizer_model("no_vocab")
    cls(src, gguf.LlamaFileType.ALL_F32, gguf_path, is_big_endian=False, use_temp_file=False,
        eager=True).write()
    if npz is None:
        return
    out = {}
    for t in gguf.GGUFReader(gguf_path).tensors:
        if t.name.endswith("_exps.weight"):
            out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type)
        else:
            out[t.name] = np.zeros(0, np.float32)  # the name is what is checked
    np.savez(npz, **out)


def logits(model_path: Path, tokens: list[int], threads: int, one_by_one: bool) -> np.ndarray:
    import llama_cpp as lc

    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.use_extra_bufts = False  # no AMX/repacked buffers (bench/llama.py: SIGILL on some VMs)
    model = lc.llama_model_load_from_file(str(model_path).encode(), mp)
    if not model:
        raise SystemExit(f"{model_path}: llama.cpp could not load it")
    n = len(tokens)
    cp = lc.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(n, 32)
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = threads
    cp.type_k = cp.type_v = lc.GGML_TYPE_F32
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = lc.llama_init_from_model(model, cp)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    out = np.empty((n, vocab), np.float32)
    step = 1 if one_by_one else n
    batch = lc.llama_batch_init(step, 0, 1)
    for start in range(0, n, step):
        batch.n_tokens = min(step, n - start)
        for j in range(batch.n_tokens):
            batch.token[j], batch.pos[j] = tokens[start + j], start + j
            batch.n_seq_id[j], batch.seq_id[j][0], batch.logits[j] = 1, 0, True
        if (rc := lc.llama_decode(ctx, batch)) != 0:
            raise SystemExit(f"llama_decode returned {rc} at position {start}")
        for j in range(batch.n_tokens):
            out[start + j] = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, j),
                                                   shape=(vocab,))
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return out


def main(argv: list[str]) -> None:
    if argv[0] == "convert":
        convert(Path(argv[1]), Path(argv[2]), Path(argv[3]),
                Path(argv[4]) if len(argv) > 4 else None)
    elif argv[0] == "logits":
        toks = np.load(argv[2]).astype(int).tolist()
        np.save(argv[4], logits(Path(argv[1]), toks, int(argv[3]), "--one-by-one" in argv[5:]))
    else:
        raise SystemExit(f"unknown command {argv[0]!r} (convert, logits)")


if __name__ == "__main__":
    main(sys.argv[1:])
