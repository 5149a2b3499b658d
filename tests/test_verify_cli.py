"""`moepack verify` as a user runs it: output, JSON and exit codes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from damage import flip
from moepack.format import Container
from moepack.format.synthetic import mixtral_spec, write_synthetic
from typer.testing import CliRunner

from moepack.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "m.moepack"
    write_synthetic(path, mixtral_spec())
    return path


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "m.moepack"
    shutil.copyfile(pristine, dst)
    return dst


def _flip_expert(path: Path, layer: int, expert: int) -> tuple[int, int]:
    with Container.open(path) as c:
        off, stride = c.expert_range(layer, expert)
    flip(path, off + 1, 0x55)
    return off, stride


def test_intact_summary(pristine: Path) -> None:
    with Container.open(pristine) as c:
        cid = c.id
    res = runner.invoke(app, ["verify", str(pristine)])
    assert res.exit_code == 0, res.output
    assert cid in res.output and "OK: intact" in res.output and "GB/s" in res.output


def test_damaged_expert_named_with_range(copy: Path) -> None:
    off, stride = _flip_expert(copy, 1, 3)
    res = runner.invoke(app, ["verify", str(copy), "--threads", "2"])
    assert res.exit_code == 1
    assert "layer 1 expert 3" in res.output
    assert f"bytes {off}..{off + stride}" in res.output
    line = next(ln for ln in res.output.splitlines() if "layer 1 expert 3" in ln)
    assert "[content_hash]" in line


def test_json(copy: Path) -> None:
    off, stride = _flip_expert(copy, 0, 0)
    res = runner.invoke(app, ["verify", str(copy), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 1
    assert [(d["kind"], d["label"], d["offset"], d["length"]) for d in doc["damaged"]] == [
        ("expert", "layer 0 expert 0", off, stride)]
    assert [d["code"] for d in doc["damaged"]] == ["content_hash"]


def test_quick_does_not_read_experts(copy: Path) -> None:
    _flip_expert(copy, 0, 0)
    res = runner.invoke(app, ["verify", str(copy), "--quick"])
    assert res.exit_code == 0 and "quick" in res.output


def test_not_verifiable_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "zero.moepack"
    p.write_bytes(bytes(4096))
    res = runner.invoke(app, ["verify", str(p)])
    assert res.exit_code == 2
    assert "unfinished conversion" in res.output
    res = runner.invoke(app, ["verify", str(p), "--json"])
    assert res.exit_code == 2 and "unfinished" in json.loads(res.stdout)["error"]


@pytest.mark.parametrize("args", [
    [],
    ["a.moepack", "--source", "d"],
    ["a.moepack", "--expect", "e.json"],
    ["--source", "d", "--quick"],
    ["a.moepack", "--io", "mmap"],
])
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert runner.invoke(app, ["verify", *args]).exit_code == 2


def test_source(tmp_path: Path) -> None:
    data = b"x" * 1000
    (tmp_path / "model.safetensors").write_bytes(data)
    manifest = {"repo": "r", "revision": "v", "files": [
        {"name": "model.safetensors", "size": 1000, "sha256": hashlib.sha256(data).hexdigest()},
        {"name": "model-2.safetensors", "size": 5, "sha256": "0" * 64}]}
    (tmp_path / "moepack-source.json").write_text(json.dumps(manifest))
    res = runner.invoke(app, ["verify", "--source", str(tmp_path)])
    assert res.exit_code == 1
    assert "missing" in res.output and "model-2.safetensors" in res.output
    res = runner.invoke(app, ["verify", "--source", str(tmp_path), "--json"])
    doc = json.loads(res.stdout)
    assert [(p["kind"], p["name"]) for p in doc["problems"]] == [
        ("missing", "model-2.safetensors")]


def test_progress_bar_appears_only_on_long_runs() -> None:
    import io

    from moepack.verify.render import LazyProgress
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    with LazyProgress(console, "verify") as bar:
        bar(1, 10)
        assert bar.bar is None  # a short run shows nothing
        bar.t0 -= 5
        bar(5 << 20, 10 << 20)
        assert bar.bar is not None
    assert "verify" in buf.getvalue()
