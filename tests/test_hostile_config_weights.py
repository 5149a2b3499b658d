"""Weights convert cannot encode, refused before anything is created: NaN/Inf in a norm, trunk
or expert tensor (found by the fingerprint pass, fused with hashing) and dtypes convert does not
read (planning time); one line naming tensor and file, exit 1, the folder tree unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hostile_snapshot import assert_one_line_error, snapshot
from hostile_sources import (
    EXPERT,
    NORM,
    assert_nothing_created,
    convert_cli,
    mixtral_tensors,
    write_checkpoint,
)
from moepack.convert.fingerprint import FETCH_MANIFEST, fingerprint, first_nonfinite

BF16_NAN, BF16_INF = b"\xc0\x7f", b"\x80\x7f"


def _with(name: str, dtype: str, data: bytes, shape: tuple[int, ...] | None = None) -> dict:
    t = mixtral_tensors()
    t[name] = (dtype, shape or t[name][1], data)
    return t


def _refused(tmp_path: Path, tensors: dict, needle: str, *extra: str) -> None:
    src = write_checkpoint(tmp_path, tensors=tensors)
    out = tmp_path / "m.moepack"
    before = snapshot(tmp_path)
    rc, output = convert_cli(src, out, *extra)
    assert_one_line_error(rc, output, 1, needle)
    assert_nothing_created(tmp_path, before, out)


def _f32(values: list[float]) -> bytes:
    return np.array(values, "<f4").tobytes()


NONFINITE = {
    "norm-nan": (NORM, "F32", _f32([1.0] * 5 + [float("nan")] + [1.0] * 2), 5),
    "final-norm-inf": ("model.norm.weight", "F32", _f32([float("-inf")] + [1.0] * 7), 0),
    "expert-inf-bf16": (EXPERT, "BF16", BF16_INF * 64, 0),
    "expert-nan-bf16": (EXPERT, "BF16", b"\x80\x3f" * 63 + BF16_NAN, 63),
    "trunk-inf-f16": ("lm_head.weight", "F16", b"\x00\x3c" * 100 + b"\x00\x7c" * 28, 100),
}


@pytest.mark.parametrize("case", sorted(NONFINITE))
def test_non_finite_weights_are_refused_up_front(tmp_path: Path, case: str) -> None:
    name, dtype, data, at = NONFINITE[case]
    _refused(tmp_path, _with(name, dtype, data),
             f"model.safetensors: tensor {name!r} holds non-finite values (NaN or Inf; first at "
             f"element {at})")


def test_fetch_hashes_do_not_skip_the_scan(tmp_path: Path) -> None:
    """A hash recorded by fetch saves the SHA-256, not the finiteness scan."""
    src = write_checkpoint(tmp_path / "a", tensors=_with(NORM, "F32", _f32([float("nan")] * 8)))
    size = (src / "model.safetensors").stat().st_size
    (src / FETCH_MANIFEST).write_text(json.dumps(
        {"files": [{"name": "model.safetensors", "size": size, "sha256": "0" * 64}]}))
    from moepack.convert.errors import SourceError

    with pytest.raises(SourceError, match=f"tensor {NORM!r} holds non-finite values"):
        fingerprint(src, ["model.safetensors"])


@pytest.mark.parametrize("dtype,mask", [("F32", 0x7F800000), ("F16", 0x7C00), ("BF16", 0x7F80),
                                        ("F8_E4M3", 0x7F)])
def test_first_nonfinite_per_dtype(dtype: str, mask: int) -> None:
    view = {"F32": "<u4", "F16": "<u2", "BF16": "<u2", "F8_E4M3": "u1"}[dtype]
    a = np.arange(40, dtype=view) & (mask >> 1)  # finite values only
    assert first_nonfinite(a.tobytes(), dtype) is None
    a[17] |= mask
    assert first_nonfinite(a.tobytes(), dtype) == 17


@pytest.mark.parametrize("dtype,item,name", [
    ("I8", 1, NORM), ("U8", 1, EXPERT), ("I32", 4, NORM), ("F64", 8, EXPERT), ("BOOL", 1, NORM),
    ("I64", 8, EXPERT)])
def test_unsupported_weight_dtypes_are_refused_at_planning(tmp_path: Path, dtype: str,
                                                           item: int, name: str) -> None:
    """Refused by the plan (a dry run sees it), so a real run creates nothing either."""
    shape = mixtral_tensors()[name][1]
    tensors = _with(name, dtype, bytes(int(np.prod(shape)) * item))
    needle = (f"model.safetensors: tensor {name!r} has unsupported dtype {dtype} (convert reads "
              "F32, F16, BF16, F8_E4M3)")
    _refused(tmp_path / "dry", tensors, needle, "--dry-run")
    if dtype == "F64":
        _refused(tmp_path / "run", tensors, needle)


def test_an_unknown_dtype_name_is_refused(tmp_path: Path) -> None:
    _refused(tmp_path, _with(NORM, "U16", bytes(16)),
             f"model.safetensors: tensor {NORM!r}: unknown dtype 'U16'")


def test_fp8_without_block_size_is_refused_at_planning(tmp_path: Path) -> None:
    _refused(tmp_path, _with(EXPERT, "F8_E4M3", bytes(64)),
             f"model.safetensors: tensor {EXPERT!r} is fp8 but config.json has no "
             "quantization_config.weight_block_size", "--dry-run")
