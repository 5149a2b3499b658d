"""Hostile containers whose blob names are paths (FORMAT.md §4.2, §11 step 25): resealed, so
the container ID matches, yet `verify`, `info` and `export` refuse them with one line and write
nothing anywhere; both readers agree, and the planner refuses to write such a name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hostile_snapshot import (
    BLOBS,
    assert_one_line_error,
    changes,
    cli,
    moepack,
    rename_blob,
    snapshot,
)
from moepack.format import Container, FormatError, plan_layout
from moepack.format.layout import BlobSpec, ContainerSpec
from moepack.runtime import _lib

from moepack.safefs import name_problem

RULE = "a blob name must be a plain file name"
# name -> the reason both readers give (safefs.name_problem's words)
HOSTILE = {
    "../evil": "contains a path separator",
    "../../evil": "contains a path separator",
    "sub/evil": "contains a path separator",
    "..\\evil": "contains a path separator",
    ".": "is empty, '.' or '..'",
    "..": "is empty, '.' or '..'",
    "a" * 256: "is longer than 255 bytes",
}


def _hostile(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "hostile.moepack"
    path.write_bytes(rename_blob(BLOBS.read_bytes(), "generation_config.json", name))
    return path


@pytest.mark.parametrize("name", sorted(HOSTILE), ids=lambda n: n[:12])
def test_both_readers_refuse_with_the_same_reason(tmp_path: Path, name: str) -> None:
    path = _hostile(tmp_path, name)
    want = f"{HOSTILE[name]}; {RULE}"
    with pytest.raises(FormatError, match=want.replace(".", r"\.")) as e:
        Container.open(path)
    c = _lib.check_container(path)
    assert (c.rc, c.code, c.field, c.message) == (-2, "blob_name", e.value.field, str(e.value))
    assert e.value.code == "blob_name" and e.value.field.endswith(".name")
    assert name_problem(name) == HOSTILE[name]  # the spec's rule is safefs's rule


def test_absolute_name_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    path = _hostile(tmp_path, str(victim))
    with pytest.raises(FormatError, match=f"contains a path separator; {RULE}"):
        Container.open(path)
    assert _lib.check_container(path).rc != 0


@pytest.mark.parametrize("name", ["...", ".hidden", "a" * 255, "chat_template.jinja"])
def test_plain_names_stay_valid(tmp_path: Path, name: str) -> None:
    path = _hostile(tmp_path, name)
    with Container.open(path) as c:
        assert name in c.blob_names()
    c = _lib.check_container(path)
    assert (c.rc, c.message) == (0, "")


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", ".", "..", "a\\b", "a" * 256])
def test_planner_refuses_a_path_as_blob_name(name: str) -> None:
    with Container.open(BLOBS) as c:
        manifest = c.manifest
    spec = ContainerSpec(manifest, (), (), (BlobSpec(name, 4),), alignment=512)
    with pytest.raises(FormatError, match=RULE):
        plan_layout(spec)


@pytest.mark.parametrize("kind", ["parent", "absolute", "dot"])
def test_cli_refuses_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    """verify (exit 2), info (1; with --json the error object) and export (1): one line naming
    the rule; nothing created, changed or removed anywhere under the parent folder, the victim
    file included."""
    work = tmp_path / "work"
    work.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    name = {"parent": "../evil", "absolute": str(victim), "dot": "."}[kind]
    path = work / "hostile.moepack"
    path.write_bytes(rename_blob(BLOBS.read_bytes(), "generation_config.json", name))
    before = snapshot(tmp_path)
    run = moepack if kind == "parent" else cli  # one case as a real process, the rest faster
    for args, code in ((["verify", path], 2), (["info", path], 1), (["info", "--json", path], 1),
                       (["export", path, work / "out"], 1),
                       (["export", "--force", path, work / "out"], 1)):
        rc, output = run(*args)
        if "--json" in args:  # the error object `run --json` prints, the rule in its message
            assert rc == code and RULE in json.loads(output)["error"]["message"], output
        else:
            assert_one_line_error(rc, output, code, RULE)
    assert changes(before, snapshot(tmp_path)) == set()
    assert victim.read_bytes() == b"keep me"


def test_a_valid_copy_still_exports(tmp_path: Path) -> None:
    """The control: the same base container, unrenamed, exports its blobs inside OUTDIR."""
    shutil.copy(BLOBS, tmp_path / "ok.moepack")
    rc, output = moepack("export", tmp_path / "ok.moepack", tmp_path / "out")
    assert rc == 0, output
    assert (tmp_path / "out" / "generation_config.json").is_file()
