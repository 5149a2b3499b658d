"""The tiny K3 checkpoint (tests/k3_checkpoint.py) through llama.cpp's own K3 converter: it must
map every tensor (so the layout the tests write is the one llama.cpp reads), and its MXFP4
experts, repacked to ggml blocks and dequantised by gguf-py, must equal moepack's reading.

Needs the llama.cpp sources vendored in the llama-cpp-python 0.3.36 source package: pass
`--llama-cpp DIR` with its `vendor/llama.cpp` directory (skipped otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from k3_checkpoint import TEXT, make_k3_checkpoint
from moepack.convert.adapters import adapter_for
from moepack.convert.mapping import bind
from moepack.convert.source import Checkpoint


@pytest.fixture(scope="module")
def lcpp(llama_cpp_dir: Path) -> Path:
    if not (llama_cpp_dir / "conversion" / "kimi_k3.py").is_file():
        pytest.fail(f"--llama-cpp {llama_cpp_dir}: no conversion/kimi_k3.py (llama.cpp with K3)")
    return llama_cpp_dir


@pytest.mark.slow  # about 10 s: llama.cpp imports torch and transformers
def test_llama_cpp_reads_the_tiny_checkpoint_and_its_experts(tmp_path, lcpp):
    src = make_k3_checkpoint(tmp_path / "src")
    npz = tmp_path / "dump.npz"
    run = subprocess.run([sys.executable, str(Path(__file__).parent / "k3_llamacpp.py"),
                          str(lcpp), str(src), str(tmp_path / "k3.gguf"), str(npz)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    dump = np.load(npz)
    layers = TEXT["num_hidden_layers"]
    for i in range(layers):  # both AttnRes scores of every layer, fused by llama.cpp
        assert {f"blk.{i}.attn_res_score.weight", f"blk.{i}.ffn_res_score.weight"} <= set(dump)
    assert "output_res_score.weight" in dump and "blk.1.attn_gate.weight" in dump
    assert "blk.0.ssm_g.weight" in dump and "blk.2.ffn_routed_norm.weight" in dump
    ck = Checkpoint(src)
    smap = bind(ck, adapter_for(ck.config))
    for layer in range(1, layers):
        for part, name in (("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"),
                           ("down", "ffn_down_exps")):
            theirs = dump[f"blk.{layer}.{name}.weight"]  # [experts, rows, cols]
            for e in range(TEXT["num_experts"]):
                np.testing.assert_array_equal(theirs[e], ck.read(smap.expert(layer, e, part)))
