"""fetch / torrent create / seed refuse bad arguments up front: exit 2 for usage, 1 with one
line for what the files are; nothing is written over the container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from moepack.format.synthetic import mixtral_spec, write_synthetic
from typer.testing import CliRunner

from moepack.cli import app

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("c") / "tiny.moepack"
    write_synthetic(path, mixtral_spec(layers=2, experts=8, hidden=128, inter=64))
    return path


def _run(*args: str):  # noqa: ANN202
    return CliRunner().invoke(app, list(args))


def _one_error_line(output: str) -> bool:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error:")


def test_torrent_create_never_writes_over_its_input(container: Path, tmp_path: Path) -> None:
    work = tmp_path / "w"
    (work / "sub").mkdir(parents=True)
    x = work / "x.moepack"
    x.write_bytes(container.read_bytes())
    os.link(x, work / "hard.moepack")
    (work / "sym.moepack").symlink_to(x)
    before = x.read_bytes()
    for out in (x, work / "sub" / ".." / "x.moepack", work / "hard.moepack",
                work / "sym.moepack"):
        r = _run("torrent", "create", str(x), "-o", str(out))
        assert r.exit_code == 1, (out, r.output)
        assert _one_error_line(r.output) and "itself" in r.output, r.output
        assert x.read_bytes() == before
        assert not list(work.glob("*.tmp"))


def test_torrent_create_names_a_missing_file(tmp_path: Path) -> None:
    r = _run("torrent", "create", str(tmp_path / "nonexist.moepack"))
    assert r.exit_code == 1 and "no such file" in r.output and "regular" not in r.output


@pytest.mark.parametrize("size", ["1000", "3KiB", "8KiB", "256MiB", "512MiB", "2GiB", "1TiB",
                                  "lots"])
def test_piece_size_out_of_range_is_a_usage_error(container: Path, tmp_path: Path,
                                                  size: str) -> None:
    r = _run("torrent", "create", str(container), "-o", str(tmp_path / "t.torrent"),
             "--piece-size", size)
    assert r.exit_code == 2, r.output
    assert "16 KiB" in r.output and "128 MiB" in r.output
    assert not (tmp_path / "t.torrent").exists()


def test_largest_piece_size_is_accepted(container: Path, tmp_path: Path) -> None:
    r = _run("torrent", "create", str(container), "-o", str(tmp_path / "t.torrent"),
             "--piece-size", "128MiB")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args", [
    ["fetch", "x.torrent", "--peer", "bogus"],
    ["fetch", "x.torrent", "--peer", "127.0.0.1:70000"],
    ["fetch", "x.torrent", "--listen", "bogus"],
    ["fetch", "x.torrent", "--stall-timeout", "-1"],
    ["fetch", "x.torrent", "--stall-timeout", "0"],
    ["fetch", "x.torrent", "--stall-timeout", "nan"],
    ["fetch", "hf:org/model", "--stall-timeout", "-1"],
    ["fetch", "hf:org"],
    ["seed", "x.torrent", "--path", "x.moepack", "--listen", "bogus"],
    ["seed", "x.torrent", "--path", "x.moepack", "--duration", "-5"],
    ["seed", "x.torrent", "--path", "x.moepack", "--duration", "inf"],
])
def test_bad_arguments_are_usage_errors(args: list[str], tmp_path: Path) -> None:
    r = _run(*args, *(["--dest", str(tmp_path)] if args[0] == "fetch" else []))
    assert r.exit_code == 2, r.output
    assert not any(tmp_path.iterdir())


def test_utf8_refusal_is_a_whole_sentence(tmp_path: Path) -> None:
    r = _run("torrent", "create", str(tmp_path / "bad\udcff.moepack"))
    assert r.exit_code == 1 and r.output.rstrip().endswith("valid UTF-8"), r.output


def test_fetch_of_a_container_says_what_it_is(container: Path, tmp_path: Path) -> None:
    r = _run("fetch", str(container), "--dest", str(tmp_path / "d"))
    assert r.exit_code == 1 and _one_error_line(r.output), r.output
    assert "container" in r.output and "torrent create" in r.output


def test_fetch_without_hf_prefix_suggests_it(tmp_path: Path) -> None:
    r = _run("fetch", "org/model", "--dest", str(tmp_path))
    assert r.exit_code == 1 and "hf:org/model" in r.output, r.output


@pytest.mark.parametrize("source", ["hf:org/repo", "x.torrent"])
@pytest.mark.parametrize("under", [False, True])
def test_a_dest_that_cannot_be_a_folder_is_refused_by_the_dry_run_too(
        tmp_path: Path, source: str, under: bool) -> None:
    """--dest naming a file, or a path under one: the dry run refuses it as the real run does
    (it said "fits" and exited 0), before reaching the hub or the torrent."""
    file = tmp_path / "f"
    file.write_bytes(b"kept")
    dest = file / "sub" if under else file
    for extra in (["--dry-run"], []):
        r = _run("fetch", source, "--dest", str(dest), *extra)
        assert r.exit_code == 1 and _one_error_line(r.output), r.output
        assert "not a folder" in r.output, r.output
    assert file.read_bytes() == b"kept"
