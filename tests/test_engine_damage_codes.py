"""A container damaged after the engine opened it: the EngineError of the failing feed carries
a stable code (spec/FORMAT.md §11.1) - `content_hash` for a record whose BLAKE3 fails
(verify_reads), the open-time rule a shortened file now breaks - and a plain I/O failure none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from damage import flip
from moepack.format.errors import CODES
from moepack.format.reader import Container
from moepack.runtime.engine import MP_ECORRUPT, MP_EIO, CorruptError, Engine, EngineError
from tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> Path:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("mixtral")
    make_checkpoint("mixtral", d / "src", hidden_size=64, intermediate_size=40,
                    num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                    tokenizer=False)
    convert(d / "src", d / "m.moepack", Settings())
    return d / "m.moepack"


def _copy(src: Path, dst: Path) -> tuple[Path, list[tuple[int, int]]]:
    dst.write_bytes(src.read_bytes())
    with Container.open(dst) as c:
        return dst, [c.expert_range(1, e) for e in range(4)]


def test_record_damaged_after_open_is_content_hash(mixtral: Path, tmp_path: Path) -> None:
    bad, ranges = _copy(mixtral, tmp_path / "bad.moepack")
    with Engine(bad, verify_reads=True, cache_experts=0) as e:
        for off, _ in ranges:  # every layer-1 expert, after open
            flip(bad, off + 5)
        with pytest.raises(CorruptError) as err:
            e.feed([1, 2, 3])
    assert err.value.code == MP_ECORRUPT
    assert err.value.format_code == "content_hash" and "content_hash" in CODES
    assert err.value.offset in {off for off, _ in ranges}
    assert f"at offset {err.value.offset}" in str(err.value)


def test_file_shortened_after_open_names_the_rule_it_breaks(mixtral: Path,
                                                            tmp_path: Path) -> None:
    short, ranges = _copy(mixtral, tmp_path / "short.moepack")
    with Engine(short, cache_experts=0) as e:
        os.truncate(short, min(off for off, _ in ranges))  # every layer-1 record gone
        with pytest.raises(EngineError) as err:
            e.feed([1, 2, 3])
    assert err.value.code == MP_EIO
    assert err.value.format_code in {"file_size_mismatch", "truncated"}
    assert err.value.field is not None and err.value.field.startswith("header")


def test_plain_io_failure_carries_no_format_code(mixtral: Path, tmp_path: Path) -> None:
    """An I/O error on an intact file (here: the engine reports one, the file still checks)."""
    from moepack.runtime.engine import _raise

    with pytest.raises(EngineError) as err:
        _raise(MP_EIO, "read of 4096 bytes at offset 0 failed: Input/output error", mixtral)
    assert err.value.code == MP_EIO and err.value.format_code is None


def test_run_json_names_a_damaged_record(mixtral: Path, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from moepack.cli import app

    bad, ranges = _copy(mixtral, tmp_path / "bad.moepack")
    for off, _ in ranges:  # damaged at rest: open checks no payload, the first read does
        flip(bad, off + 5)
    args = ["run", str(bad), "--tokens", "1,2,3", "-n", "2", "--verify-reads"]
    r = CliRunner().invoke(app, [*args, "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 1 and (err["code"], err["engine_code"]) == ("content_hash", MP_ECORRUPT)
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 1 and "[content_hash]" in plain.output
