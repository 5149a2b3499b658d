"""The whole engine (container -> cache -> forward pass -> sampling) under AddressSanitizer and
UBSan, on a converted tiny model of every architecture the engine runs (tests/tiny_containers.py:
every model*.c file: DSA in its sparse regime, K3's AttnRes and latent MoE, glm5_next's
hyper-connections and k-pools) plus two wide synthetic ones, with cache large / off / one record
and scalar kernels, and a long prompt whose passes borrow the cache on each tiny model and a
synthetic one, cancelled once from another thread. Marked slow (it compiles runtime/src with
sanitizers); `make test-asan` (CI) runs it."""

from __future__ import annotations

import pytest
from sanitized_engine import run_engine_under_sanitizers
from tiny_containers import ENGINE_ARCHS, tiny_container


@pytest.mark.slow
def test_engine_under_asan_and_ubsan(tmp_path):
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    files = [tiny_container(arch, tmp_path / arch) for arch in ENGINE_ARCHS]
    write_synthetic(tmp_path / "wide.moepack", mixtral_spec(hidden=256, inter=192, vocab=80))
    files.append(tmp_path / "wide.moepack")
    write_synthetic(tmp_path / "q6.moepack", mixtral_spec(  # q6 trunk, 4-column group tails
        hidden=260, inter=96, vocab=80, heads=2, kv_heads=1,
        attn={"name": "q6", "group_size": 32}, embed={"name": "q6", "group_size": 16}))
    files.append(tmp_path / "q6.moepack")
    # experts many and wide enough against a chunk token that a long prompt borrows the cache
    write_synthetic(tmp_path / "borrow.moepack",
                    mixtral_spec(layers=2, experts=32, hidden=512, inter=1024, vocab=256))
    files.append(tmp_path / "borrow.moepack")
    out = run_engine_under_sanitizers(tmp_path, files, timeout=600)
    for f in files[:len(ENGINE_ARCHS)] + [tmp_path / "borrow.moepack"]:
        assert f"borrowed {f}:" in out, (f, out)
    # a cancel during the long prompt (moepack.h mp_set_cancel) leaves nothing behind
    assert "cancel" in out and ": wrong" not in out, out
    assert f"cancel {tmp_path / 'borrow.moepack'}: landed" in out, out
