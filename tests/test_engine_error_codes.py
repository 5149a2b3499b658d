"""EngineError carries the stable format code (spec/FORMAT.md §11.1) a program acts on: every
invalid vector refused by the engine names the code, field and offset its .expected.json and the
C reader give; a refused model description or tensor has its own code; `run --json` prints them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moepack.runtime import _lib
from moepack.runtime.engine import MP_EFORMAT, Engine, EngineError, plan
from spec_vectors import INVALID, VECTORS, load_generator
from typer.testing import CliRunner

VALID = VECTORS / "valid" / "mixtral2.moepack"
gen = load_generator()


def _expected_code(path: Path) -> str:
    return json.loads(path.with_suffix(".expected.json").read_text())["code"]


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_engine_refusal_names_the_vectors_code(path: Path) -> None:
    check = _lib.check_container(path)
    for opener in (lambda: Engine(str(path)), lambda: plan(str(path))):
        with pytest.raises(EngineError) as e:
            opener()
        err = e.value
        if err.code != MP_EFORMAT:  # a file the engine cannot read at all names no rule
            assert err.format_code is None
            continue
        assert err.format_code == _expected_code(path)
        assert (err.field, err.offset) == (check.field, check.offset)
        assert str(err) == check.message


def _resealed(tmp_path: Path, edit) -> Path:
    """The valid vector with its index document changed by `edit` (hashes made to match)."""
    data = VALID.read_bytes()
    doc = gen.index_doc(data)
    edit(doc)
    out = tmp_path / "edited.moepack"
    out.write_bytes(gen.reseal(data, doc))
    assert _lib.check_container(out).rc == 0  # the container itself is well-formed
    return out


def test_refused_model_description_is_model_description(tmp_path: Path) -> None:
    def odd_head_dim(doc: dict) -> None:
        doc["manifest"]["model"]["head_dim"] = 7

    with pytest.raises(EngineError) as e:
        Engine(str(_resealed(tmp_path, odd_head_dim)))
    assert e.value.format_code == "model_description"
    assert e.value.field == "index.manifest.model.head_dim"
    assert e.value.offset is None


def test_missing_model_tensor_is_model_tensor(tmp_path: Path) -> None:
    def rename_norm(doc: dict) -> None:
        norm = next(s for s in doc["sections"] if s.get("name") == "layers.0.attn_norm")
        norm["name"] = "layers.0.attn_norm_renamed"

    with pytest.raises(EngineError) as e:
        Engine(str(_resealed(tmp_path, rename_norm)))
    assert "layers.0.attn_norm" in str(e.value)
    assert e.value.format_code == "model_tensor"


def test_non_format_errors_carry_no_format_code(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as e:
        Engine(str(tmp_path / "absent.moepack"))
    assert e.value.code != MP_EFORMAT and e.value.format_code is None


def test_run_json_prints_the_code(tmp_path: Path) -> None:
    from moepack.cli import app

    bad = VECTORS / "invalid" / "bad_magic.moepack"
    r = CliRunner().invoke(app, ["run", str(bad), "--tokens", "1", "--json"])
    assert r.exit_code == 1
    err = json.loads(r.stdout)["error"]
    assert (err["code"], err["engine_code"], err["field"]) == (
        "bad_magic", MP_EFORMAT, _lib.check_container(bad).field)
    assert err["message"].startswith(str(bad))
    plain = CliRunner().invoke(app, ["run", str(bad), "--tokens", "1"])
    assert plain.exit_code == 1 and "[bad_magic]" in plain.output
    # a text prompt reads the tokenizer from the container first: the code still comes out
    text = CliRunner().invoke(app, ["run", str(bad), "hello", "--json"])
    assert text.exit_code == 1 and json.loads(text.stdout)["error"]["code"] == "bad_magic"
    chat = CliRunner().invoke(app, ["chat", str(bad)], input="hi\n")
    assert chat.exit_code == 1 and "[bad_magic]" in chat.output


def test_serve_error_object_names_the_code() -> None:
    from moepack.serve.app import _engine_error

    from moepack.cli import app

    bad = VECTORS / "invalid" / "bad_magic.moepack"
    from serve_fixtures import free_port

    r = CliRunner().invoke(app, ["serve", str(bad), "--port", str(free_port())])
    assert r.exit_code == 1 and "[bad_magic]" in r.output
    body = _engine_error(EngineError("x", MP_EFORMAT, "blob_frame")).body()["error"]
    assert body["code"] == "blob_frame"
    assert _engine_error(EngineError("y", -3)).body()["error"]["code"] == "engine_error"


@pytest.mark.parametrize("path", INVALID[:8], ids=[p.stem for p in INVALID[:8]])
def test_tokenizer_passes_the_readers_format_error_through(path: Path) -> None:
    from moepack.format.errors import FormatError
    from moepack.runtime.tokenizer import Tokenizer

    with pytest.raises(FormatError) as e:
        Tokenizer.from_container(str(path))
    assert e.value.code == _expected_code(path)
    as_engine = EngineError.from_format(e.value)
    assert (as_engine.format_code, as_engine.field, as_engine.offset, as_engine.code) == (
        e.value.code, e.value.field, e.value.offset, MP_EFORMAT)
