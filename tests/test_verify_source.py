"""verify_source: a checkpoint directory against the fetch manifest or the hub's file listing."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moepack.verify import SourceReport, verify_source
from moepack.verify.expect import ExpectError, parse_expectations

SHARDS = {
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(200_000),
    "config.json": b'{"model_type": "mixtral"}',
}


def _manifest(files: dict[str, bytes]) -> dict:
    return {"repo": "org/model", "revision": "abc123", "files": [
        {"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
        for n, d in sorted(files.items())]}


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    for name, data in SHARDS.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "moepack-source.json").write_text(json.dumps(_manifest(SHARDS)))
    return tmp_path


def _kinds(r: SourceReport) -> list[tuple[str, str]]:
    return [(p.kind, p.name) for p in r.problems]


def test_intact(ckpt: Path) -> None:
    r = verify_source(ckpt)
    assert r.ok and r.exit_code == 0 and r.files_checked == 3
    assert r.bytes_checked == sum(len(d) for d in SHARDS.values())
    assert r.extra == []


def test_missing_shard(ckpt: Path) -> None:
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    r = verify_source(ckpt)
    assert r.exit_code == 1
    assert _kinds(r) == [("missing", "model-00002-of-00002.safetensors")]


def test_truncated_shard(ckpt: Path) -> None:
    p = ckpt / "model-00001-of-00002.safetensors"
    p.write_bytes(SHARDS[p.name][:16])  # a mirror once served a 16-byte shard
    r = verify_source(ckpt)
    assert _kinds(r) == [("truncated", p.name)]
    assert (r.problems[0].actual_size, r.problems[0].expected_size) == (16, 300_000)


def test_oversized_shard(ckpt: Path) -> None:
    p = ckpt / "config.json"
    p.write_bytes(SHARDS["config.json"] + b"\n")
    assert _kinds(verify_source(ckpt)) == [("oversized", "config.json")]


def test_modified_shard(ckpt: Path) -> None:
    p = ckpt / "model-00002-of-00002.safetensors"
    data = bytearray(SHARDS[p.name])
    data[123_456] ^= 1
    p.write_bytes(data)
    r = verify_source(ckpt)
    assert _kinds(r) == [("mismatched", p.name)]
    assert "sha256" in r.problems[0].detail


def test_extra_files_are_listed_not_fatal(ckpt: Path) -> None:
    (ckpt / "model-00003-of-00003.safetensors").write_bytes(b"stale")
    (ckpt / "README.md").write_text("not a weight or config")
    (ckpt / ".cache").mkdir()
    (ckpt / ".cache" / "x.json").write_text("{}")
    r = verify_source(ckpt)
    assert r.ok and r.extra == ["model-00003-of-00003.safetensors"]


def test_hub_tree_listing(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tree API's shape: LFS files carry lfs.oid (sha256), git files a blob SHA-1 oid."""
    def git_sha1(d: bytes) -> str:
        return hashlib.sha1(b"blob %d\x00" % len(d) + d).hexdigest()

    tree = [{"type": "directory", "path": "sub", "oid": "0" * 40, "size": 0}]
    for name, data in SHARDS.items():
        entry = {"type": "file", "path": name, "size": len(data), "oid": git_sha1(data)}
        if name.endswith(".safetensors"):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
        tree.append(entry)
    expect = tmp_path_factory.mktemp("expect") / "tree.json"
    expect.write_text(json.dumps(tree))
    assert verify_source(ckpt, expect).ok
    (ckpt / "config.json").write_bytes(b'{"model_type": "mixtrax"}')  # same size
    assert _kinds(verify_source(ckpt, expect)) == [("mismatched", "config.json")]


def test_hub_siblings_listing(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    siblings = [{"rfilename": n, "size": len(d), "lfs": {"sha256": hashlib.sha256(d).hexdigest()}}
                for n, d in SHARDS.items() if n.endswith(".safetensors")]
    siblings.append({"rfilename": "config.json"})  # no size, no hash: presence only
    expect = tmp_path_factory.mktemp("expect") / "siblings.json"
    expect.write_text(json.dumps({"siblings": siblings}))
    r = verify_source(ckpt, expect)
    assert r.ok and r.size_only == ["config.json"]


def test_no_manifest(tmp_path: Path) -> None:
    r = verify_source(tmp_path)
    assert r.exit_code == 2 and "moepack fetch" in (r.error or "")


def test_not_a_directory(tmp_path: Path) -> None:
    assert verify_source(tmp_path / "nope").exit_code == 2


@pytest.mark.parametrize("doc", [
    {"files": [{"name": "../etc/passwd", "size": 1, "sha256": "0" * 64}]},
    {"files": [{"name": "a", "size": -1, "sha256": "0" * 64}]},
    {"files": [{"name": "a", "size": 1, "sha256": "xyz"}]},
    {"files": [{"name": "a", "size": 1, "sha256": "0" * 64}] * 2},
    [{"path": "/abs", "size": 1}],
    [{"path": "a", "size": 1, "lfs": {"oid": "short"}}],
    "just a string",
    [3],
])
def test_bad_expectations_are_rejected(doc: object) -> None:
    with pytest.raises(ExpectError):
        parse_expectations(doc)


def test_bad_json_expect_file(ckpt: Path) -> None:
    (ckpt / "moepack-source.json").write_text("{not json")
    r = verify_source(ckpt)
    assert r.exit_code == 2 and "not valid JSON" in (r.error or "")


def test_reads_what_fetch_writes(tmp_path: Path) -> None:
    from moepack.fetch.manifest import write_manifest

    for name, data in SHARDS.items():
        (tmp_path / name).write_bytes(data)
    write_manifest(tmp_path, "org/model", "abc",
                   [(n, len(d), hashlib.sha256(d).hexdigest()) for n, d in SHARDS.items()])
    r = verify_source(tmp_path)
    assert r.ok and r.files_checked == len(SHARDS), r


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["files", "name", "size", "sha256", "path", "rfilename", "lfs", "oid",
                         "blobId", "type", "siblings"]), inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(doc=_json)
def test_any_expectation_document_parses_or_is_rejected_cleanly(doc: object) -> None:
    try:
        files = parse_expectations(doc)
    except ExpectError:
        return
    for f in files:
        assert f.name and not f.name.startswith("/") and ".." not in f.name.split("/")
