"""Hostile config.json, index.json and safetensors headers through the real `moepack convert`:
one line naming file and field, exit 1, no traceback, nothing created (no OUT, OUT.partial or
OUT.journal; the folder tree unchanged). Bounds (format/model_desc.py, docs/CONVERT.md) are
checked before anything is sized by them: the memory test runs under `ulimit -v`."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hostile_snapshot import assert_one_line_error, snapshot
from hostile_sources import (
    MIXTRAL,
    assert_nothing_created,
    convert_cli,
    mixtral_tensors,
    write_checkpoint,
)

VMEM_KB = 4_000_000  # 4 GB of address space: the unbounded planner needed 22.7 GB


def _refused(tmp_path: Path, src: Path, needle: str, **kw: Any) -> float:
    """Convert; assert the one-line refusal and an untouched tree; return the seconds taken."""
    out = tmp_path / "m.moepack"
    before = snapshot(tmp_path)
    t0 = time.monotonic()
    rc, output = convert_cli(src, out, **kw)
    took = time.monotonic() - t0
    assert_one_line_error(rc, output, 1, needle)
    assert_nothing_created(tmp_path, before, out)
    return took


def test_a_valid_hand_written_checkpoint_converts(tmp_path: Path) -> None:
    """The control: the base checkpoint every hostile variant changes converts as is."""
    src = write_checkpoint(tmp_path)
    rc, output = convert_cli(src, tmp_path / "m.moepack", vmem_kb=VMEM_KB)
    assert rc == 0, output
    assert (tmp_path / "m.moepack").is_file()


@pytest.mark.parametrize("key,value", [
    ("num_hidden_layers", 1_000_000_000), ("num_local_experts", 10**12),
    ("vocab_size", 1 << 40), ("hidden_size", 1 << 40), ("intermediate_size", 1 << 40),
    ("num_attention_heads", 1 << 40), ("max_position_embeddings", 1 << 62),
])
def test_huge_counts_are_refused_quickly_under_ulimit(tmp_path: Path, key: str,
                                                      value: int) -> None:
    src = write_checkpoint(tmp_path, {**MIXTRAL, key: value})
    took = _refused(tmp_path, src, f"config.json: '{key}' must be an integer in",
                    vmem_kb=VMEM_KB)
    assert took < 20


def test_huge_dry_run_is_refused_too(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path, {**MIXTRAL, "num_hidden_layers": 10**9})
    rc, output = convert_cli(src, tmp_path / "m.moepack", "--dry-run", vmem_kb=VMEM_KB)
    assert_one_line_error(rc, output, 1, "'num_hidden_layers' must be an integer in 1..4096")


# config values the engine would refuse at `run` (format/model_desc.py rules)
ENGINE_REFUSES = [
    ("num_experts_per_tok", 0, "'num_experts_per_tok' must be an integer in 1..65536, got 0"),
    ("num_experts_per_tok", 3, "'num_experts_per_tok' (model description moe.top_k) must be "
                               "an integer in 1..2, got 3"),
    ("rope_theta", -10000.0, "'rope_theta' must be a finite number > 1"),
    ("rope_theta", 0, "'rope_theta' must be a finite number > 1"),
    ("rope_theta", float("nan"), "'rope_theta' must be a finite number > 1, got nan"),
    ("rms_norm_eps", 0, "'rms_norm_eps' must be a finite number in (0, 1)"),
    ("rms_norm_eps", -1e-5, "'rms_norm_eps' must be a finite number in (0, 1)"),
    ("rms_norm_eps", float("inf"), "'rms_norm_eps' must be a finite number in (0, 1)"),
    ("sliding_window", -4, "'sliding_window' (model description attention.sliding_window) "
                           "must be an integer in 1.."),
    ("sliding_window", 0, "'sliding_window' (model description attention.sliding_window) "
                          "must be an integer in 1.."),
    ("num_hidden_layers", 0, "'num_hidden_layers' must be an integer in 1..4096, got 0"),
    ("num_key_value_heads", 3, "'num_attention_heads' must be a multiple of "
                               "num_key_value_heads (3)"),
    ("head_dim", 3, "'head_dim' must be even"),
    ("num_local_experts", 0, "'num_local_experts' must be an integer in 1..65536, got 0"),
    ("rope_scaling", {"type": "linear", "factor": 2.0},
     "'rope_scaling' type 'linear' is not supported (yarn)"),
]


@pytest.mark.parametrize("key,value,needle", ENGINE_REFUSES,
                         ids=[f"{k}={v}" for k, v, _ in ENGINE_REFUSES])
def test_configs_the_engine_refuses_are_refused_up_front(tmp_path: Path, key: str, value: Any,
                                                         needle: str) -> None:
    src = write_checkpoint(tmp_path, {**MIXTRAL, key: value})
    _refused(tmp_path, src, f"config.json: {needle}")


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deeply_nested_config_is_one_line(tmp_path: Path, depth: int) -> None:
    src = write_checkpoint(tmp_path)
    text = json.dumps({**MIXTRAL, "extra": "@"})
    (src / "config.json").write_text(text.replace('"@"', _deep(depth)))
    _refused(tmp_path, src, "config.json: not readable JSON: JSON nested deeper than 64 levels")


def test_oversized_config_is_refused_before_reading(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path)
    with open(src / "config.json", "r+b") as f:  # sparse: 65 MB of size, no data written
        f.truncate(65 << 20)
    _refused(tmp_path, src, "config.json: 68,157,440 bytes, larger than the 67,108,864 accepted",
             vmem_kb=VMEM_KB)


@pytest.mark.parametrize("config", [[1, 2], "x", {"architectures": 5},
                                    {"architectures": [{"a": 1}]},
                                    {"architectures": [], "model_type": ["mixtral"]}],
                         ids=["list", "string", "arch-int", "arch-dict", "type-list"])
def test_config_of_the_wrong_shape(tmp_path: Path, config: Any) -> None:
    src = write_checkpoint(tmp_path)
    (src / "config.json").write_text(json.dumps(config))
    _refused(tmp_path, src, "config.json: ")


def _header_file(tmp_path: Path, header: Any = None, raw: bytes | None = None) -> Path:
    src = write_checkpoint(tmp_path)
    if raw is None:
        raw = json.dumps(header).encode()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return src


def test_deeply_nested_safetensors_header(tmp_path: Path) -> None:
    src = _header_file(tmp_path, raw=('{"a": ' + _deep(100_000) + "}").encode())
    _refused(tmp_path, src, "model.safetensors: corrupt safetensors header: JSON nested deeper "
                            "than 64 levels")


def test_header_length_beyond_the_cap(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path)
    (src / "model.safetensors").write_bytes(struct.pack("<Q", (1 << 63) + 5) + b"{}")
    _refused(tmp_path, src, "model.safetensors: corrupt safetensors header: header length")


@pytest.mark.parametrize("entry,needle", [
    ({"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}, "corrupt shape"),
    ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "corrupt shape"),
    ({"dtype": "F32", "shape": [10**30, 10**30], "data_offsets": [0, 4]},
     "data_offsets [0, 4] disagree"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 10**30]}, "data_offsets [0, 1000"),
    ({"dtype": "Q99", "shape": [1], "data_offsets": [0, 4]}, "unknown dtype 'Q99'"),
    ({"dtype": "F32", "shape": [1], "data_offsets": "x" * 10_000}, "corrupt data_offsets 'xxx"),
])
def test_hostile_header_entries(tmp_path: Path, entry: dict, needle: str) -> None:
    src = _header_file(tmp_path, {"w": entry})
    _refused(tmp_path, src, f"model.safetensors: tensor 'w': {needle}")


def test_index_with_hostile_weight_map(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path)
    index = src / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": ["model.safetensors"]}}))
    _refused(tmp_path, src, "model.safetensors.index.json: weight_map values must be file names")
    index.write_text('{"weight_map": ' + _deep(5000) + "}")
    _refused(tmp_path, src, "model.safetensors.index.json: not readable JSON: JSON nested deeper")


def test_a_config_that_is_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    import os

    src = write_checkpoint(tmp_path)
    (src / "config.json").unlink()
    os.mkfifo(src / "config.json")
    took = _refused(tmp_path, src, "config.json: not a regular file")
    assert took < 20


def test_tensor_table_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More tensors than MAX_TENSORS is refused (bound lowered here: the real one is 4M)."""
    from moepack.convert import source, st_header
    from moepack.convert.errors import SourceError

    monkeypatch.setattr(st_header, "MAX_TENSORS", 3)
    src = write_checkpoint(tmp_path)
    n = len(mixtral_tensors())
    with pytest.raises(SourceError, match=f"model.safetensors: corrupt safetensors header: {n} "
                                          r"entries \(at most 3 tensors"):
        source.Checkpoint(src)
