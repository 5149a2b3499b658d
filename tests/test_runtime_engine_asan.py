"""The whole engine (container -> cache -> forward pass -> sampling) under AddressSanitizer and
UBSan, on converted tiny models of every architecture plus a wide synthetic one, with cache
large / off / one record and scalar kernels. Slow: it compiles runtime/src with sanitizers."""

from __future__ import annotations

import pytest
from sanitized_engine import (
    DRIVER,  # noqa: F401 (test_runtime_models_dsa.py imports it here)
    run_engine_under_sanitizers,
)
from tiny_models import ARCHS, make_checkpoint


@pytest.mark.slow
def test_engine_under_asan_and_ubsan(tmp_path):
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    files = []
    # GQA variants too: q/k/v biases and partial RoPE (GLM), full-width q/k norms (MiniMax),
    # and an INT4-sourced nested model (Kimi K2.5)
    for arch in ARCHS:
        make_checkpoint(arch, tmp_path / arch, **({"int4_group": 4} if arch == "kimi_k25" else {}))
        convert(tmp_path / arch, tmp_path / f"{arch}.moepack", Settings())
        files.append(tmp_path / f"{arch}.moepack")
    write_synthetic(tmp_path / "wide.moepack", mixtral_spec(hidden=256, inter=192, vocab=80))
    files.append(tmp_path / "wide.moepack")
    write_synthetic(tmp_path / "q6.moepack", mixtral_spec(  # q6 trunk, 4-column group tails
        hidden=260, inter=96, vocab=80, heads=2, kv_heads=1,
        attn={"name": "q6", "group_size": 32}, embed={"name": "q6", "group_size": 16}))
    files.append(tmp_path / "q6.moepack")
    run_engine_under_sanitizers(tmp_path, files)
