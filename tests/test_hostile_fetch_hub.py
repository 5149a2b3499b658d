"""Hostile hub listings and planted links against `moepack fetch hf:…` (issue 13).

A fake hub on loopback (tests/hub_server.py) serves crafted listings; links are planted where
fetch writes. Each case checks the one-line message and exit code, that no traceback shows, and
that nothing outside the destination was created, changed or lost (`outside_state`: names,
sizes, mtimes and content hashes of the destination's parent, the destination left out:
hostile_snapshot.snapshot).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hostile_snapshot import assert_one_line_error, cli, error_line, moepack, snapshot
from hub_server import HubRepo, HubServer
from moepack.fetch import hub_listing, space

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

REPO = "org/hostile"
OID = "0" * 40
SHA = "1" * 64


def entry(path: object, size: object = 5, **extra: object) -> dict:
    return {"type": "file", "path": path, "size": size, "oid": OID, **extra}


def tree(*entries: object) -> bytes:
    return json.dumps(list(entries)).encode()


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch):
    """serve(HubRepo) -> the running server (stopped at the end of the test)."""
    servers: list[HubServer] = []

    def start(repo: HubRepo) -> HubServer:
        server = HubServer({REPO: repo}).__enter__()
        servers.append(server)
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        return server

    yield start
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file beside the destination that a redirected write would damage."""
    p = tmp_path / "victim.bin"
    p.write_bytes(b"precious bytes, not to be touched\n")
    return p


def _refused(tmp_path: Path, needle: str, *, dry_run: bool = False) -> str:
    """Fetch from a hub serving `body` as its tree: exit 1, one line naming the repo and
    `needle`, nothing outside DEST touched, DEST not even created."""
    dest = tmp_path / "dest"
    before = snapshot(tmp_path, dest)
    args = ["fetch", f"hf:{REPO}", "--dest", dest] + (["--dry-run"] if dry_run else [])
    rc, out = cli(*args)
    assert_one_line_error(rc, out, 1, needle)
    assert REPO in out, out
    assert snapshot(tmp_path, dest) == before
    assert not dest.exists()
    return out


# A listing entry named '.' was the reported bug: DEST/. is DEST, so the download went to
# DEST.incomplete beside the destination.
UNSAFE_NAMES = [".", "..", "a/../b", "./a", "a/.", "/etc/passwd", "a//b", "", "a/", "a\\b",
                "x\x1b[31mred", "x\x00y", "x\u202ey", "x\ny", "a" * 300]


@pytest.mark.parametrize("name", UNSAFE_NAMES, ids=repr)
def test_unsafe_listed_names_are_refused(serve, tmp_path: Path, name: str) -> None:
    (tmp_path / "dest.incomplete").write_bytes(b"an existing file beside the destination")
    serve(HubRepo({}, tree=tree(entry(name))))
    out = _refused(tmp_path, "unsafe file name")
    assert "\x1b" not in out and "\x00" not in out and "\u202e" not in out, "shown escaped"
    assert (tmp_path / "dest.incomplete").read_bytes() == b"an existing file beside the destination"


def test_dot_name_through_the_real_command(serve, tmp_path: Path) -> None:
    """The same refusal from `python -m moepack` in a subprocess, exit code and all."""
    beside = tmp_path / "dest.incomplete"
    beside.write_bytes(b"keep me")
    serve(HubRepo({}, tree=tree(entry("config.json"), entry("."))))
    dest = tmp_path / "dest"
    before = snapshot(tmp_path, dest)
    rc, out = moepack("fetch", f"hf:{REPO}", "--dest", dest)
    assert_one_line_error(rc, out, 1, "unsafe file name '.' in the hub listing")
    assert snapshot(tmp_path, dest) == before and beside.read_bytes() == b"keep me"


def test_escape_sequences_in_a_name_never_reach_the_terminal(serve, tmp_path: Path) -> None:
    serve(HubRepo({}, tree=tree(entry("\x1b]0;pwned\x07\x1b[2Jmodel.bin"))))
    rc, out = moepack("fetch", f"hf:{REPO}", "--dest", tmp_path / "dest", "--dry-run")
    assert_one_line_error(rc, out, 1, "unsafe file name")
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;pwned\\x07" in out, repr(out)


@pytest.mark.parametrize("name", [".moepack-partial/hub-verified.json", "moepack-source.json",
                                  "model.bin.incomplete"])
def test_names_fetch_uses_itself_are_refused(serve, tmp_path: Path, name: str) -> None:
    serve(HubRepo({}, tree=tree(entry("model.bin"), entry(name))))
    _refused(tmp_path, "uses for its own files")


MALFORMED = {
    "negative size": (tree(entry("a.bin", -5)), "'size' -5 is outside"),
    "size too large": (tree(entry("a.bin", 1 << 60)), f"is outside 0..{1 << 46}"),
    "size a string": (tree(entry("a.bin", "5")), "'size' is a string, expected an integer"),
    "size a boolean": (tree(entry("a.bin", True)), "'size' is a boolean"),
    "size a float": (tree(entry("a.bin", 5.0)), "'size' is a number, expected an integer"),
    "path a number": (tree(entry(7)), "'path' is a number, not a string"),
    "path missing": (tree({"type": "file", "size": 1, "oid": OID}), "'path' is null"),
    "type unknown": (tree({**entry("a"), "type": "symlink"}), "'type' 'symlink' is neither"),
    "oid missing": (tree({"type": "file", "path": "a", "size": 1}), "'oid' is null"),
    "oid not hex": (tree(entry("a", oid="zz")), "malformed git 'oid' 'zz'"),
    "lfs an array": (tree(entry("a", lfs=[1])), "'lfs' is an array, expected an object"),
    "lfs bad sha": (tree(entry("a", lfs={"oid": "x" * 64})), "malformed LFS sha256"),
    "lfs other size": (tree(entry("a", lfs={"oid": SHA, "size": 9})), "differs from 'size' 5"),
    "entry an array": (tree([1, 2]), "entry 1 is an array, not an object"),
    "listing an object": (json.dumps({"path": "a"}).encode(), "listing page is an object"),
    "listed twice": (tree(entry("a.bin"), entry("a.bin")), "'a.bin' is listed twice"),
    "file and folder": (tree(entry("a"), entry("a/b")), "'a' both as a file and as a folder"),
    "deeply nested": (b"[" * 200_000 + b"]" * 200_000, "JSON nested deeper than 16 levels"),
    "nested in a field": (tree(entry("a", lfs=json.loads("[" * 30 + "]" * 30))),
                          "JSON nested deeper"),
    "not JSON": (b"{not json", "not valid JSON"),
    "not UTF-8": (b'[{"path": "\xff"}]', "not UTF-8"),
    "total absurd": (tree(*(entry(f"f{i}", 1 << 46) for i in range(17))), "totals"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_listing_is_one_line(serve, tmp_path: Path, case: str) -> None:
    body, needle = MALFORMED[case]
    serve(HubRepo({}, tree=body))
    _refused(tmp_path, needle)


def test_negative_size_no_longer_passes_the_space_check(serve, tmp_path: Path) -> None:
    serve(HubRepo({}, tree=tree(entry("a.bin", 10), entry("b.bin", -(1 << 40)))))
    out = _refused(tmp_path, "'size' -1099511627776 is outside", dry_run=True)
    assert "fits" not in out


def test_entry_count_is_bounded(serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_listing, "MAX_ENTRIES", 50)
    serve(HubRepo({}, tree=tree(*(entry(f"f{i}") for i in range(51)))))
    _refused(tmp_path, "more than 50 entries")


def test_answer_size_is_bounded(serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_listing, "MAX_PAGE_BYTES", 4096)
    serve(HubRepo({}, tree=tree(*(entry(f"file-{i:05d}.bin") for i in range(200)))))
    _refused(tmp_path, "larger than 4096 bytes")


@pytest.mark.parametrize("info,needle", [
    (b'{"sha": "not-a-commit"}', "('sha' is 'not-a-commit')"),
    (b'{"sha": 12}', "('sha' is a number)"),
    (b'["sha"]', "('sha' is null)"),
    (b"{" * 5000, "nested deeper"),
])
def test_malformed_model_info_is_one_line(serve, tmp_path: Path, info: bytes,
                                          needle: str) -> None:
    serve(HubRepo({"a.bin": b"x"}, info=info))
    _refused(tmp_path, needle)


# -- planted links where fetch writes ---------------------------------------------------------

FILES = {"config.json": b'{"model_type": "mixtral"}', "model.bin": os.urandom(3000),
         "original/params.json": b'{"dim": 8}'}


def _fetch(dest: Path, *include: str) -> tuple[int, str]:
    args: list[str | Path] = ["fetch", f"hf:{REPO}", "--dest", dest, "--stall-timeout", "5"]
    for g in include:
        args += ["--include", g]
    return cli(*args)


def test_nested_repo_paths_still_download(serve, tmp_path: Path) -> None:
    serve(HubRepo(dict(FILES)))
    rc, out = _fetch(tmp_path / "dest")
    assert rc == 0, out
    for name, data in FILES.items():
        assert (tmp_path / "dest" / name).read_bytes() == data


def test_link_at_incomplete_is_refused(serve, tmp_path: Path, victim: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "model.bin.incomplete").symlink_to(victim)
    serve(HubRepo(dict(FILES)))
    before = snapshot(tmp_path, dest)
    rc, out = _fetch(dest, "model.bin")
    line = error_line(out)
    assert rc == 1 and "model.bin.incomplete is a symbolic link" in line, out
    assert snapshot(tmp_path, dest) == before
    assert (dest / "model.bin.incomplete").is_symlink() and not (dest / "model.bin").exists()


def test_link_at_a_listed_subfolder_is_refused(serve, tmp_path: Path) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (elsewhere / "params.json").write_bytes(b"theirs")
    (dest / "original").symlink_to(elsewhere)
    serve(HubRepo(dict(FILES)))
    before = snapshot(tmp_path, dest)
    rc, out = _fetch(dest, "original/*")
    assert rc == 1 and "original is a symbolic link" in error_line(out), out
    assert snapshot(tmp_path, dest) == before


def test_link_at_the_state_folder_is_refused(serve, tmp_path: Path) -> None:
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / ".moepack-partial").symlink_to(elsewhere)
    serve(HubRepo(dict(FILES)))
    before = snapshot(tmp_path, dest)
    rc, out = _fetch(dest, "config.json")
    assert rc == 1 and ".moepack-partial is a symbolic link" in error_line(out), out
    assert snapshot(tmp_path, dest) == before and not any(elsewhere.iterdir())


def test_state_folder_unusable_with_the_files_already_there_is_one_line(serve,
                                                                       tmp_path: Path) -> None:
    """The files are on disk (hashed, not downloaded) and the state folder cannot be made (a
    file stands at its name): one line naming it, exit 1, not an internal error; the files
    stay as they were."""
    dest = tmp_path / "dest"
    serve(HubRepo(dict(FILES)))
    assert _fetch(dest)[0] == 0
    (dest / "moepack-source.json").unlink()
    for p in (dest / ".moepack-partial").iterdir():
        p.unlink()
    (dest / ".moepack-partial").rmdir()
    (dest / ".moepack-partial").write_bytes(b"not a folder")
    before = snapshot(tmp_path)
    rc, out = _fetch(dest)
    assert rc == 1, out
    assert ".moepack-partial exists and is not a folder" in error_line(out), out
    assert snapshot(tmp_path) == before


def test_links_at_final_names_and_temporaries_are_replaced_not_followed(
        serve, tmp_path: Path, victim: Path) -> None:
    """A link at NAME, at the state file's .tmp, at the manifest and at its .tmp: each entry is
    replaced by a real file; the file the links point at keeps its bytes."""
    dest = tmp_path / "dest"
    (dest / ".moepack-partial").mkdir(parents=True)
    for planted in ("model.bin", ".moepack-partial/hub-verified.tmp",
                    ".moepack-partial/hub-verified.json", "moepack-source.json",
                    "moepack-source.json.tmp"):
        (dest / planted).symlink_to(victim)
    serve(HubRepo(dict(FILES)))
    before = snapshot(tmp_path, dest)
    rc, out = _fetch(dest)
    assert rc == 0, out
    assert snapshot(tmp_path, dest) == before
    assert (dest / "model.bin").read_bytes() == FILES["model.bin"]
    assert not (dest / "model.bin").is_symlink()
    manifest = json.loads((dest / "moepack-source.json").read_text())
    assert manifest["repo"] == REPO and len(manifest["files"]) == len(FILES)
    assert not (dest / "moepack-source.json.tmp").exists()


def test_fifo_as_state_file_does_not_block(serve, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / ".moepack-partial").mkdir(parents=True)
    os.mkfifo(dest / ".moepack-partial" / "hub-verified.json")
    serve(HubRepo(dict(FILES)))
    rc, out = _fetch(dest, "config.json")
    assert rc == 0, out
    assert (dest / "config.json").read_bytes() == FILES["config.json"]


def test_dry_run_with_free_space_patched_still_refuses(serve, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A negative size cannot be offset by free space either (the check is on the listing)."""
    monkeypatch.setattr(space, "free_bytes", lambda path: 1 << 62)
    serve(HubRepo({}, tree=tree(entry("a.bin", -1))))
    _refused(tmp_path, "'size' -1 is outside", dry_run=True)
