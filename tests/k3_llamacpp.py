"""Convert a checkpoint with llama.cpp's own Kimi K3 converter (`KimiK3Model` of the llama.cpp
sources vendored in llama-cpp-python's source package) to an F32 GGUF, and dump what it wrote:
tensor names, and the routed experts dequantised by gguf-py (ggml's MXFP4 blocks).

    python tests/k3_llamacpp.py LLAMA_CPP_DIR CHECKPOINT_DIR OUT.gguf OUT.npz

Run in its own process: llama.cpp's `conversion` and `gguf` packages are put on sys.path, and
its vocabulary step is skipped (tiny test checkpoints have no tokenizer)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def main(lcpp: Path, src: Path, gguf_path: Path, npz: Path) -> None:
    sys.path[:0] = [str(lcpp), str(lcpp / "gguf-py")]
    import gguf
    from conversion import ModelBase, ModelType, load_all_models

    load_all_models()
    cls = ModelBase.from_model_architecture("KimiK3ForConditionalGeneration",
                                            model_type=ModelType.TEXT)
    cls.set_vocab = lambda self: None
    cls(src, gguf.LlamaFileType.ALL_F32, gguf_path, is_big_endian=False, use_temp_file=False,
        eager=True).write()
    out = {}
    for t in gguf.GGUFReader(gguf_path).tensors:
        if t.name.endswith("_exps.weight"):
            out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type)
        else:
            out[t.name] = np.zeros(0, np.float32)  # the name is what is checked
    np.savez(npz, **out)


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:5]))
