"""Source checkpoint reading: fp8 block dequantisation, damaged files, fingerprints."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest
import torch
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import SourceError
from moepack.convert.fingerprint import FETCH_MANIFEST, fingerprint
from moepack.convert.mapping import bind
from moepack.convert.source import Checkpoint, SourceRef
from safetensors import safe_open
from tiny_models import make_checkpoint


def _shards(d):
    return sorted(p for p in d.iterdir() if p.suffix == ".safetensors")


def _bind(d):
    ck = Checkpoint(d)
    return bind(ck, adapter_for(ck.config))


def test_fp8_block_dequant_matches_direct_reference(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path / "fp8", fp8_block=(8, 8))
    ref_src = make_checkpoint("deepseek_v3", tmp_path / "f32")  # same seed: the original weights
    ck, ref = Checkpoint(src), Checkpoint(ref_src)
    assert ck.fp8_block == (8, 8)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"  # [28, 12]: partial edge blocks
    info = ck.info(name)
    assert info.dtype == "F8_E4M3"
    got = ck.read(SourceRef(name))
    with safe_open(src / info.file, "pt") as f:
        q = f.get_tensor(name).float().numpy()
    sinfo = ck.info(name + "_scale_inv")
    with safe_open(src / sinfo.file, "pt") as f:
        s = f.get_tensor(name + "_scale_inv").numpy()
    want = np.empty_like(q)
    for r in range(q.shape[0]):  # element by element, no broadcasting tricks
        for c in range(q.shape[1]):
            want[r, c] = q[r, c] * s[r // 8, c // 8]
    np.testing.assert_array_equal(got, want)
    orig = ref.read(SourceRef(name))
    assert np.max(np.abs(got - orig)) <= 0.07 * np.max(np.abs(orig))  # e4m3: 3 mantissa bits
    _bind(src)  # every tensor of the fp8 checkpoint resolves


def test_fp8_without_block_size_is_an_error(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path, fp8_block=(8, 8))
    cfg = json.loads((src / "config.json").read_text())
    del cfg["quantization_config"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SourceError, match="weight_block_size"):
        Checkpoint(src).read(SourceRef("model.layers.1.mlp.experts.0.up_proj.weight"))


def test_truncated_shard_names_file_and_tensor(tmp_path):
    src = make_checkpoint("mixtral", tmp_path)
    shard = _shards(src)[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(SourceError) as e:
        Checkpoint(src)
    msg = str(e.value)
    assert shard.name in msg and "truncated" in msg and "tensor '" in msg


def test_corrupt_header_names_file(tmp_path):
    src = make_checkpoint("qwen3_moe", tmp_path)
    shard = _shards(src)[0]
    data = bytearray(shard.read_bytes())
    (hlen,) = struct.unpack("<Q", data[:8])
    data[8:12] = b"\xff{[x"
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=f"{shard.name}: corrupt safetensors header"):
        Checkpoint(src)
    data[:8] = struct.pack("<Q", 1 << 40)
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="header length"):
        Checkpoint(src)


def _drop_tensor(src, name, keep_index=False):
    """Rewrite the shard holding `name` without it."""
    from safetensors.torch import save_file

    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    fname = index["weight_map"][name]
    with safe_open(src / fname, "pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys() if k != name}
    save_file(kept, src / fname)
    if not keep_index:
        del index["weight_map"][name]
        index_path.write_text(json.dumps(index))
    return fname


def test_missing_tensor(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path / "a")
    _drop_tensor(src, "model.layers.2.mlp.gate.e_score_correction_bias")
    with pytest.raises(SourceError, match="e_score_correction_bias' .*missing"):
        _bind(src)
    src = make_checkpoint("mixtral", tmp_path / "b")
    _drop_tensor(src, "model.layers.1.block_sparse_moe.experts.2.w3.weight")
    with pytest.raises(SourceError, match=r"experts\.2\.w3\.weight' missing"):
        _bind(src)
    src = make_checkpoint("mixtral", tmp_path / "c")
    fname = _drop_tensor(src, "model.norm.weight", keep_index=True)
    with pytest.raises(SourceError, match=f"{fname}: has no tensor 'model.norm.weight'"):
        Checkpoint(src)


def test_shape_disagreeing_with_config(tmp_path):
    src = make_checkpoint("qwen3_moe", tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["moe_intermediate_size"] = 16
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SourceError) as e:
        _bind(src)
    msg = str(e.value)
    assert "model-0000" in msg and "experts.0.gate_proj.weight" in msg
    assert "[12, 36]" in msg and "[16, 36]" in msg


def test_unsupported_dtype(tmp_path):
    from safetensors.torch import save_file

    src = make_checkpoint("mixtral", tmp_path)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    fname = index["weight_map"]["model.norm.weight"]
    with safe_open(src / fname, "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    t["model.norm.weight"] = t["model.norm.weight"].to(torch.int32)
    save_file(t, src / fname)
    with pytest.raises(SourceError, match="'model.norm.weight' has unsupported dtype I32"):
        Checkpoint(src).read(SourceRef("model.norm.weight"))


def test_bf16_and_f16_read_as_f32(tmp_path):
    src = make_checkpoint("mixtral", tmp_path / "bf")
    ck = Checkpoint(src)
    name = "model.layers.0.self_attn.q_proj.weight"
    # The tiny models are f32; store one tensor as bf16 explicitly.
    from safetensors.torch import save_file

    fname = ck.info(name).file
    with safe_open(src / fname, "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    orig = t[name].clone()
    t[name] = orig.to(torch.bfloat16)
    save_file(t, src / fname)
    got = Checkpoint(src).read(SourceRef(name))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, orig.to(torch.bfloat16).float().numpy())


def test_fingerprint_hashes_and_reuses_fetch_manifest(tmp_path):
    src = make_checkpoint("mixtral", tmp_path)
    files = [p.name for p in _shards(src)]
    fp = fingerprint(src, files)
    for f in fp:
        assert f["sha256"] == hashlib.sha256((src / f["name"]).read_bytes()).hexdigest()
        assert f["size"] == (src / f["name"]).stat().st_size
    fake = [{"name": f["name"], "size": f["size"], "sha256": "ab" * 32} for f in fp]
    (src / FETCH_MANIFEST).write_text(json.dumps({"repo": "x/y", "revision": "r", "files": fake}))
    assert all(f["sha256"] == "ab" * 32 for f in fingerprint(src, files))
    # a file modified after fetch recorded its hash is hashed again
    later = (src / FETCH_MANIFEST).stat().st_mtime_ns + 10**9
    os.utime(src / files[0], ns=(later, later))
    again = fingerprint(src, files)
    assert again[0]["sha256"] == fp[0]["sha256"] and again[1]["sha256"] == "ab" * 32
    # journal-known hashes are reused when size and mtime match exactly
    known = {f["name"]: (f["size"], f["mtime_ns"], "cd" * 32) for f in again}
    assert all(f["sha256"] == "cd" * 32 for f in fingerprint(src, files, known))


def test_e4m3_table_matches_torch_for_every_byte():
    from moepack.convert.fp8 import to_f32

    raw = bytes(range(256))
    want = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    np.testing.assert_array_equal(to_f32(raw, "F8_E4M3", (256,)), want.numpy())


def test_fused_expert_slices_read_the_right_rows(tmp_path):
    from safetensors.torch import save_file

    t = torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(3, 4, 5).to(torch.bfloat16)
    save_file({"x": t}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("{}")
    ck = Checkpoint(tmp_path)
    got = ck.read(SourceRef("x", 2, (1, 3)))
    np.testing.assert_array_equal(got, t[2, 1:3].float().numpy())
    np.testing.assert_array_equal(ck.read(SourceRef("x", 1)), t[1].float().numpy())


@pytest.mark.parametrize("codec", [{"name": "q8", "group_size": 32},
                                   {"name": "q4", "group_size": 16, "zero_point": False},
                                   {"name": "q4", "group_size": 64, "zero_point": True},
                                   {"name": "q6", "group_size": 32},
                                   {"name": "bf16"}, {"name": "f32"}])
def test_row_band_encoding_is_byte_identical(codec):
    from moepack.convert.quant import encode
    from moepack.convert.rowchunks import encode_by_rows

    w = np.random.default_rng(1).standard_t(4, size=(300, 77)).astype(np.float32)
    whole = encode(codec, w)
    banded = encode_by_rows(codec, w.shape, lambda lo, hi: w[lo:hi], band=128)
    assert bytes(banded) == whole


def test_fp8_row_bands_match_whole_read(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path, fp8_block=(8, 8))
    ck = Checkpoint(src)
    name = "model.layers.0.mlp.gate_proj.weight"  # [24, 28]
    whole = ck.read(SourceRef(name))
    np.testing.assert_array_equal(ck.read(SourceRef(name, rows=(8, 24))), whole[8:24])
    np.testing.assert_array_equal(ck.read(SourceRef(name, rows=(16, 21))), whole[16:21])
    with pytest.raises(SourceError, match="multiples of 8"):
        ck.read(SourceRef(name, rows=(3, 9)))


def test_index_cannot_point_outside_the_directory(tmp_path):
    src = make_checkpoint("mixtral", tmp_path / "m")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="'../elsewhere.safetensors' is not a file name"):
        Checkpoint(src)


def test_bad_block_size(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path, fp8_block=(8, 8))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [8]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SourceError, match="weight_block_size must be two positive integers"):
        Checkpoint(src)


def test_small_files_are_read_without_reserving_their_limit(tmp_path):
    """tokenizer.json may be up to 1 GiB (MAX_BLOB_RAW): a 2 KB one must not reserve 1 GiB to be
    read (f.read(limit + 1) did: under ulimit -v 1.2 GB convert of the demo model failed with
    'out of memory'); a file over the limit is still told by the one extra byte."""
    import tracemalloc

    from moepack.convert.source import read_small
    from moepack.format.limits import MAX_BLOB_RAW

    from moepack.safefs import read_bounded

    small = tmp_path / "tokenizer.json"
    small.write_bytes(b"{}" * 1000)
    tracemalloc.start()
    try:
        assert read_small(small, MAX_BLOB_RAW) == b"{}" * 1000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    with open(small, "rb") as f:
        assert read_bounded(f, 1999, chunk=7) == b"{}" * 1000   # limit + 1: too big
    with open(small, "rb") as f:
        assert read_bounded(f, 2000, chunk=7) == b"{}" * 1000
