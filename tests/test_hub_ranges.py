"""Checked byte ranges of hub files (convert/hub_ranges.py) against a loopback server: the
streamed pass checks the whole file's SHA-256 and the planning header, block digests catch a
changed byte, saved tables are reused only for the same file, and network faults end in one
line naming the file; a dropped stream goes on from where it stopped; a private hub's token is
sent when given and its absence is one line. A Ray node's header folder (convert/cluster_hub.py)
is made once, never taken from someone else, and its removal leaves what the run did not make."""

from __future__ import annotations

import hashlib
import shutil
import tempfile

import pytest
from hub_server import HubRepo, HubServer
from moepack.convert import hub_ranges
from moepack.convert.cluster_hub import _header_folder, header_folder_path, remove_header_folder
from moepack.convert.errors import ConvertError, SourceError
from moepack.convert.hub_ranges import (
    MAX_BLOCK,
    MIN_BLOCK,
    BlockTable,
    HubToken,
    block_size,
    fetch_range,
    stream_digests,
)
from range_server import Fault, RangeServer

pytestmark = [pytest.mark.network]

DATA = bytes(range(256)) * 200            # 51,200 bytes: 4 KiB blocks, the last one partial
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(hub_ranges, "BACKOFF", 0.0)      # retries at once
    with RangeServer({"shard": DATA}) as s:
        yield s


def test_block_size_grows_with_the_file_up_to_1_mib():
    assert block_size(1) == MIN_BLOCK and block_size(len(DATA)) == MIN_BLOCK
    assert block_size(256 * 64 << 10) == 64 << 10
    assert block_size(5 << 30) == MAX_BLOCK


def test_streamed_digests_check_ranges(server):
    table = stream_digests(server.url("shard"), "shard", len(DATA), SHA, DATA[:100])
    assert len(table.digests) == 32 * -(-len(DATA) // table.block)
    lo, hi = table.span(5000, 9000)
    assert (lo, hi) == (4096, 12288)
    assert table.check(lo, fetch_range(server.url("shard"), "shard", lo, hi))
    tail_lo, tail_hi = table.span(len(DATA) - 10, len(DATA))   # the partial last block
    assert tail_hi == len(DATA) and table.check(tail_lo, DATA[tail_lo:])
    changed = bytearray(DATA[lo:hi])
    changed[1234] ^= 1
    assert not table.check(lo, bytes(changed))
    with pytest.raises(SourceError, match="outside the 51,200-byte file"):
        table.span(0, len(DATA) + 1)


def test_stream_refuses_a_wrong_sha256_or_header(server):
    with pytest.raises(ConvertError, match="shard: SHA-256 .* differs from the hub's"):
        stream_digests(server.url("shard"), "shard", len(DATA), "0" * 64, DATA[:8])
    with pytest.raises(ConvertError, match="header differs from the header the hub served"):
        stream_digests(server.url("shard"), "shard", len(DATA), SHA, b"\xff" * 16)
    with pytest.raises(ConvertError, match="more than its listed 100 bytes"):
        stream_digests(server.url("shard"), "shard", 100, SHA, DATA[:8])


def test_stream_goes_on_from_where_a_dropped_connection_stopped(server):
    clean = stream_digests(server.url("shard"), "shard", len(DATA), SHA, DATA[:8])
    server.faults["/shard"] = Fault("drop", times=1, at=20_000)
    counted: list[int] = []
    assert stream_digests(server.url("shard"), "shard", len(DATA), SHA, DATA[:8],
                          counted.append) == clean
    assert sum(counted) == len(DATA)                       # no byte fetched twice
    assert ("GET", "/shard", "bytes=20000-") in server.requests
    server.faults["/shard"] = Fault("drop", times=-1, at=30_000)   # never gets further
    with pytest.raises(ConvertError, match=r"^shard: the hub sent 30,000 of its listed 51,200 "
                                           r"bytes .*rerun the same command to continue$"):
        stream_digests(server.url("shard"), "shard", len(DATA), SHA, DATA[:8])


def test_saved_table_is_reused_only_for_the_same_file(server, tmp_path):
    table = stream_digests(server.url("shard"), "shard", len(DATA), SHA, DATA[:8])
    path = tmp_path / ".shard.blocks"
    table.save(path, SHA)
    assert BlockTable.load(path, "shard", len(DATA), SHA) == table
    assert BlockTable.load(path, "shard", len(DATA), "1" * 64) is None      # another commit
    assert BlockTable.load(path, "shard", len(DATA) + 1, SHA) is None
    path.write_bytes(path.read_bytes()[:-5])                                # cut by kill -9
    assert BlockTable.load(path, "shard", len(DATA), SHA) is None
    path.write_bytes(b"\xff\xfe garbage")
    assert BlockTable.load(path, "shard", len(DATA), SHA) is None
    assert BlockTable.load(tmp_path / "missing", "shard", len(DATA), SHA) is None


def test_range_reads_retry_a_dropped_connection_and_name_the_file(server):
    server.faults["/shard"] = Fault("drop", times=1, at=4096 + 100)
    assert fetch_range(server.url("shard"), "shard", 4096, 8192) == DATA[4096:8192]
    with pytest.raises(ConvertError, match=r"^missing: cannot read bytes 0-10 from the hub: "
                                           r"HTTP 404$"):
        fetch_range(server.url("missing"), "missing", 0, 10)


def test_a_nodes_header_folder_is_made_once_and_a_planted_entry_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bulk = {"config.json": (b"{}", 2), "a.safetensors": (b"HEAD", 1 << 20)}
    folder = _header_folder(header_folder_path("repo@1", "run1"), bulk)
    assert folder.parent == tmp_path
    standin = folder / "a.safetensors"
    assert standin.stat().st_size == 1 << 20 and standin.read_bytes()[:4] == b"HEAD"
    assert standin.stat().st_blocks * 512 < 1 << 20                     # sparse: header only
    assert _header_folder(header_folder_path("repo@1", "run1"), bulk) == folder   # made once
    assert header_folder_path("repo@1", "run2") != folder               # one folder per run
    other = _header_folder(header_folder_path("repo@2", "run1"), bulk)
    shutil.rmtree(other)
    other.write_bytes(b"planted")                                        # not a folder
    with pytest.raises(ConvertError, match="is not a folder of this user; refusing"):
        _header_folder(other, bulk)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_removing_a_header_folder_leaves_what_the_run_did_not_make(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bulk = {"config.json": (b"{}", 2), "a.safetensors": (b"HEAD", 1 << 20)}
    names = list(bulk)
    mine = _header_folder(header_folder_path("repo@1", "run1"), bulk)
    theirs = _header_folder(header_folder_path("repo@1", "run2"), bulk)   # a concurrent run
    assert remove_header_folder("repo@1", "run1", names) and not mine.exists()
    assert (theirs / "a.safetensors").is_file()                          # untouched
    (theirs / "notes.txt").write_text("a user's file")                   # not the run's
    outside = tmp_path / "precious"
    outside.write_text("keep")
    theirs.joinpath("config.json").unlink()
    theirs.joinpath("config.json").symlink_to(outside)                   # a link: left alone
    assert not remove_header_folder("repo@1", "run2", names + ["../precious"])
    assert sorted(p.name for p in theirs.iterdir()) == ["config.json", "notes.txt"]
    assert outside.read_text() == "keep"
    assert remove_header_folder("repo@1", "run3", names)                 # none: nothing to do


def test_a_private_hubs_token_is_sent_when_given(monkeypatch):
    monkeypatch.setattr(hub_ranges, "BACKOFF", 0.0)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repo = HubRepo({"config.json": b"{}", "a.safetensors": DATA})
    with HubServer({"org/private": repo}, token="hf_secret") as hub:
        url = f"{hub.base}/org/private/resolve/{repo.commit}/a.safetensors"
        token = HubToken("hf_secret")
        assert fetch_range(url, "a.safetensors", 100, 5000, token) == DATA[100:5000]
        assert "hf_secret" not in repr(token)
        with pytest.raises(ConvertError) as e:
            fetch_range(url, "a.safetensors", 100, 5000)
        line = str(e.value)
        assert line.startswith("a.safetensors: cannot read bytes 100-5000 from the hub: HTTP 401")
        assert "HF_TOKEN" in line and "\n" not in line


def test_neighbouring_reads_share_their_end_blocks(tmp_path, monkeypatch):
    """Tensors read in file order fetch each block once: a read's end block is kept for the
    next tensor, which starts in it. The values are the file's."""

    import numpy as np
    from moepack.convert.cluster_hub import RangeCheckpoint
    from moepack.convert.source import SourceRef
    from safetensors.numpy import save_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rng = np.random.default_rng(0)
    tensors = {f"t{i}": rng.standard_normal(2500 + 37 * i).astype(np.float32) for i in range(4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    header = data[:8 + int.from_bytes(data[:8], "little")]
    bulk = {"config.json": (b'{"model_type": "mixtral"}', 25),
            "model.safetensors": (header, len(data))}
    with RangeServer({"model.safetensors": data}) as server:
        table = stream_digests(server.url("model.safetensors"), "model.safetensors", len(data),
                               hashlib.sha256(data).hexdigest(), header)
        folder = _header_folder(header_folder_path("repo@1", "run1"), bulk)
        ck = RangeCheckpoint(folder, {"model.safetensors": server.url("model.safetensors")}, None)
        ck.tables["model.safetensors"] = table
        names = sorted(tensors, key=lambda n: ck.info(n).start)
        for n in names:
            assert np.array_equal(ck.read(SourceRef(n)), tensors[n])
        lo, hi = table.span(ck.info(names[0]).start, ck.info(names[-1]).end)
        assert ck.take_fetched() == hi - lo                  # every block exactly once
        ranges = [r for m, _, r in server.requests if r and not r.startswith("bytes=0-")]
        assert all(int(r[6:].split("-")[0]) % table.block == 0 for r in ranges)
        ck.kept.clear()
        assert np.array_equal(ck.read(SourceRef(names[1])), tensors[names[1]])
        first = table.span(ck.info(names[1]).start, ck.info(names[1]).end)
        assert ck.take_fetched() == first[1] - first[0]      # nothing kept: its whole span
