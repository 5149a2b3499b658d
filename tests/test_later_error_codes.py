"""Codes for what is found after `open` or while planning (spec/FORMAT.md §11.1): blob frames,
payload decoding and the planner each give the code of the rule broken, not `invalid`."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zstandard
from moepack.format import BlobSpec, FormatError, TensorSpec, plan_layout
from moepack.format import codecs as codec_mod
from moepack.format.blobs import decompress_blob
from moepack.format.errors import CODES
from moepack.format.synthetic import mixtral_spec

FORMAT = Path(__file__).resolve().parents[1] / "format"


def test_every_format_error_names_its_code() -> None:
    """No FormatError in format/ falls back to the default code silently: where no rule has a
    code of its own, `invalid` is written out."""
    bad = []
    for path in sorted(FORMAT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FormatError":
                if len(node.args) < 2 and not any(k.arg == "code" for k in node.keywords):
                    bad.append(f"{path.name}:{node.lineno}")
    assert bad == []


def _code(fn, *args, **kw) -> str:
    with pytest.raises(FormatError) as e:
        fn(*args, **kw)
    assert e.value.code in CODES
    return e.value.code


def test_blob_frame_codes() -> None:
    raw = b"tokenizer " * 1000
    frame = zstandard.ZstdCompressor(level=3).compress(raw)
    assert _code(decompress_blob, b"\x28\xb5", 1, "b") == "blob_frame"
    assert _code(decompress_blob, b"\x00" * 16, 1, "b") == "blob_frame"
    assert _code(decompress_blob, frame + frame, len(raw), "b") == "blob_frame"
    cut = frame[: zstandard.frame_header_size(frame) + 1]
    assert _code(decompress_blob, cut, len(raw), "b") == "blob_frame"
    assert _code(decompress_blob, frame, len(raw) + 1, "b") == "blob_decoded_length"
    assert _code(decompress_blob, frame, 100, "b") == "blob_decoded_length"


def test_payload_decoding_codes() -> None:
    q8 = {"name": "q8", "group_size": 32}
    n = codec_mod.encoded_nbytes(q8, (4, 32))
    assert _code(codec_mod.decode, q8, (4, 32), bytes(n - 1)) == "payload_length"
    assert _code(codec_mod.decode, {"name": "q8", "group_size": 3}, (4, 32), b"") == "bad_codec"
    assert _code(codec_mod.decode, {"name": "q8", "group_size": 32, "x": 1}, (4, 32),
                 b"") == "bad_codec"
    assert _code(codec_mod.decode, {"name": "nope"}, (4,), b"") == "unknown_codec"
    rvq = {"name": "rvq", "stages": 2, "dim": 8, "entries": 256}
    codes = bytes(codec_mod.encoded_nbytes(rvq, (64, 64)))
    assert _code(codec_mod.decode, rvq, (64, 64), codes) == "rvq_reference"  # no codebook
    wrong = np.zeros((1, 256, 8), np.float32)  # one stage, the codec says two
    assert _code(codec_mod.decode, rvq, (64, 64), codes, codebook=wrong) == "rvq_reference"


@pytest.mark.parametrize(("change", "code"), [
    ({"alignment": 1000}, "bad_alignment"),
    ({"tensors": (TensorSpec("t", "", (4,), {"name": "f32"}),)}, "empty_class"),
    ({"tensors": (TensorSpec("t", "attn", (4, 4), {"name": "q8"}),)}, "bad_codec"),
    ({"tensors": (TensorSpec("x", "n", (4,), {"name": "f32"}),) * 2}, "duplicate_name"),
    ({"blobs": (BlobSpec("b", 10, "none", 9),)}, "blob_raw_length"),
    ({"blobs": (BlobSpec("b", 10, "lz4", 9),)}, "blob_compression"),
])
def test_planner_codes(change: dict, code: str) -> None:
    spec = replace(mixtral_spec(layers=1, experts=2, alignment=512), **change)
    assert _code(plan_layout, spec) == code


def test_planner_bank_codes() -> None:
    spec = mixtral_spec(layers=2, experts=2, alignment=512)
    b = spec.banks[0]
    assert _code(plan_layout, replace(spec, banks=(b, b))) == "second_bank"
    assert _code(plan_layout, replace(spec, banks=(replace(b, parts=b.parts[::-1]),))) == (
        "part_names")
