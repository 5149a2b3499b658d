"""spec/vectors: regenerating gives identical bytes, valid ones open with the expected info, every
invalid one is rejected with its expected error (the C runtime runs the same files)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from moepack.format import Container, FormatError
from moepack.format.errors import CODES
from moepack.format.info import container_info
from spec_vectors import INVALID, VALID, VECTORS, load_generator
from typer.testing import CliRunner

from moepack.cli import app


def test_regenerating_gives_identical_bytes(tmp_path: Path) -> None:
    written = load_generator().generate(tmp_path)
    committed = {p.relative_to(VECTORS) for p in VECTORS.rglob("*") if p.is_file()
                 and p.parent != VECTORS}
    assert {p.relative_to(tmp_path) for p in written} == committed
    for p in written:
        rel = p.relative_to(tmp_path)
        assert p.read_bytes() == (VECTORS / rel).read_bytes(), f"{rel} differs when regenerated"


def test_vectors_are_small() -> None:
    assert sum(p.stat().st_size for p in VECTORS.rglob("*") if p.is_file()) < 2_000_000
    assert len(VALID) >= 3 and len(INVALID) >= 30


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector_opens_and_reads(path: Path) -> None:
    expected = json.loads(path.with_suffix(".info.json").read_text())
    with Container.open(path) as c:
        assert container_info(c) == expected
        for s in c.sections:
            if s["type"] == "tensor":
                assert len(c.tensor_bytes(s["name"])) == s["length"]
            elif s["type"] == "blob":
                assert len(c.blob(s["name"])) == s["raw_length"]
        for b in c.banks():
            for e in range(b["count"]):
                assert len(c.expert_record(b["layer"], e)) == b["stride"]


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_info_command_json_matches(path: Path) -> None:
    result = CliRunner().invoke(app, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout == path.with_suffix(".info.json").read_text()


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_vector_is_rejected(path: Path) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    with pytest.raises(FormatError) as err:
        Container.open(path)
    e = err.value
    assert (e.code, expected["error"] in str(e)) == (expected["code"], True), str(e)
    # the message starts with the field (and offset) it carries
    if e.field is not None:
        at = "" if e.offset is None else f" at offset {e.offset}"
        assert str(e).startswith(f"{e.field}{at}: ")


def test_every_code_is_in_the_spec_table() -> None:
    """FORMAT.md §11 lists exactly the codes of moepack.format.errors.CODES."""
    text = (VECTORS.parent / "FORMAT.md").read_text()
    table = text[text.index("### 11.1"):text.index("## 12.")]
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.MULTILINE))
    assert listed == set(CODES)


def test_info_command_reports_errors() -> None:
    result = CliRunner().invoke(app, ["info", str(VECTORS / "invalid" / "bad_magic.moepack")])
    assert result.exit_code == 1
    assert "bad magic" in result.output


def test_info_command_text() -> None:
    path = VECTORS / "valid" / "mixtral2.moepack"
    expected = json.loads(path.with_suffix(".info.json").read_text())
    result = CliRunner().invoke(app, ["info", str(path)])
    assert result.exit_code == 0, result.output
    assert expected["container_id"] in result.output
    assert "MixtralForCausalLM" in result.output and "bits/weight" in result.output


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector_experts_decode_and_carry_the_tile_flag(path: Path) -> None:
    """Every expert part decodes (rvq: 64-row tiles); header flag bit 0 iff some part is rvq."""
    with Container.open(path) as c:
        rvq = False
        for b in c.banks():
            for p in b["parts"]:
                rvq |= p["codec"]["name"] == "rvq"
                for e in range(b["count"]):
                    w = c.expert_part(b["layer"], e, p["name"])
                    assert w.shape == tuple(p["shape"]) and np.isfinite(w).all()
        assert bool(c.header.flags & 1) == rvq
