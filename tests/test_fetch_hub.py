"""`moepack fetch hf:…` against tests/hub_server.py (HF_ENDPOINT): plan, download, faults."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from hub_server import Fault, HubRepo, HubServer
from moepack.fetch import space
from moepack.fetch.errors import FetchError
from moepack.fetch.hub import COMPLETE, MISSING, PARTIAL, UNVERIFIED, fetch_hub, plan_hub
from moepack.fetch.hub_download import DownloadPolicy
from range_server import Body
from typer.testing import CliRunner

from moepack.cli import app

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

REPO = "org/tiny-moe"
FAST = DownloadPolicy(read_timeout=0.5, attempts=2, backoff=0.01)


def _files() -> dict[str, bytes]:
    rnd = hashlib.blake2b
    big = b"".join(rnd(b"%d" % i, digest_size=64).digest() for i in range(4096))   # 256 KiB
    mid = b"".join(rnd(b"m%d" % i, digest_size=64).digest() for i in range(1600))  # 100 KiB
    return {"config.json": json.dumps({"model_type": "mixtral"}).encode(),
            "model-00001-of-00002.safetensors": big,
            "model-00002-of-00002.safetensors": mid,
            "tokenizer.json": b'{"version": "1.0"}'}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    with HubServer({REPO: HubRepo(_files())}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def test_dry_run_counts_partial_and_missing(hub: HubServer, tmp_path: Path) -> None:
    files = _files()
    part = tmp_path / "model-00002-of-00002.safetensors.incomplete"
    part.write_bytes(files["model-00002-of-00002.safetensors"][:30_000])
    plan = plan_hub(f"hf:{REPO}", tmp_path, [])
    states = {s.file.name: s for s in plan.files}
    assert plan.listing.revision == hub.repos[REPO].commit
    assert states["model-00002-of-00002.safetensors"].status == PARTIAL
    assert states["model-00001-of-00002.safetensors"].status == MISSING
    assert plan.to_fetch == sum(len(b) for b in files.values()) - 30_000
    big = states["model-00001-of-00002.safetensors"].file
    assert big.sha256 == hashlib.sha256(files[big.name]).hexdigest()
    download = plan.verdicts[0]
    assert download.need >= plan.to_fetch and download.need_with_margin > download.need


def test_dry_run_exit_code_follows_free_space(hub: HubServer, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path), "--dry-run"])
    assert ok.exit_code == 0, ok.output
    assert "to fetch" in ok.output and "fits" in ok.output
    monkeypatch.setattr(space, "free_bytes", lambda path: 1000)
    short = runner.invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path), "--dry-run"])
    assert short.exit_code == 1
    assert "short by" in short.output
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"


def test_download_writes_files_and_manifest(hub: HubServer, tmp_path: Path) -> None:
    files = _files()
    result = fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, []), jobs=3, policy=FAST)
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    manifest = json.loads(result.manifest.read_text())
    assert manifest["repo"] == REPO and manifest["revision"] == hub.repos[REPO].commit
    assert manifest["files"] == [{"name": n, "size": len(files[n]),
                                  "sha256": hashlib.sha256(files[n]).hexdigest()}
                                 for n in sorted(files)]
    assert not list(tmp_path.glob("*.incomplete"))
    again = plan_hub(f"hf:{REPO}", tmp_path, [])
    assert {s.status for s in again.files} == {COMPLETE} and again.to_fetch == 0


def test_include_glob_selects_files(hub: HubServer, tmp_path: Path) -> None:
    plan = plan_hub(f"hf:{REPO}", tmp_path, ["*.json"])
    assert sorted(s.file.name for s in plan.files) == ["config.json", "tokenizer.json"]


def test_dropped_connection_resumes_with_range(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    hub.inject(REPO, name, Fault("drop", times=1, at=100_000))
    fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, []), jobs=1, policy=FAST)
    assert (tmp_path / name).read_bytes() == _files()[name]
    cdn = hub.fault_path(REPO, name)
    ranges = [r for (m, p, r) in hub.requests if p == cdn and m == "GET"]
    assert ranges == [None, "bytes=100000-"]


def test_sha_mismatch_is_retried(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00002-of-00002.safetensors"
    hub.inject(REPO, name, Fault("corrupt", times=1, at=5000))
    fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, []), jobs=2, policy=FAST)
    assert (tmp_path / name).read_bytes() == _files()[name]
    gets = [p for (m, p, _) in hub.requests if p == hub.fault_path(REPO, name) and m == "GET"]
    assert len(gets) == 2


def test_persistent_sha_mismatch_is_a_clear_error(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00002-of-00002.safetensors"
    hub.inject(REPO, name, Fault("corrupt", times=-1, at=5000))
    with pytest.raises(FetchError, match=rf"{name}: SHA-256 [0-9a-f]{{64}} does not match"):
        fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, []), jobs=2, policy=FAST)
    assert not (tmp_path / name).exists()
    assert not (tmp_path / "moepack-source.json").exists()


def test_plain_file_checked_by_git_blob_hash(hub: HubServer, tmp_path: Path) -> None:
    hub.inject(REPO, "config.json", Fault("corrupt", times=-1, at=3))
    with pytest.raises(FetchError, match="config.json: git blob hash does not match"):
        fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, ["config.json"]), policy=FAST)


def test_404_and_unknown_repo(hub: HubServer, tmp_path: Path) -> None:
    hub.inject(REPO, "tokenizer.json", Fault("404", times=-1))
    with pytest.raises(FetchError, match=r"tokenizer.json: not found at .* \(404\)"):
        fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, ["tokenizer.json"]), policy=FAST)
    with pytest.raises(FetchError, match="org/nope@main"):
        plan_hub("hf:org/nope", tmp_path, [])
    with pytest.raises(FetchError, match="expected hf:ORG/REPO"):
        plan_hub("hf:../etc", tmp_path, [])


def test_never_finishing_file_times_out(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    hub.inject(REPO, name, Fault("stall", times=-1, at=70_000))
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=rf"{name}: ReadTimeout .* rerun resumes"):
        fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, [name]), policy=FAST)
    assert time.monotonic() - t0 < 20
    part = tmp_path / f"{name}.incomplete"
    assert part.stat().st_size == 70_000 and not (tmp_path / name).exists()


def test_existing_complete_file_is_hashed_not_downloaded(hub: HubServer, tmp_path: Path) -> None:
    files = _files()
    name = "model-00001-of-00002.safetensors"
    (tmp_path / name).write_bytes(files[name])
    fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, []), policy=FAST)
    assert not [p for (m, p, _) in hub.requests if p == hub.fault_path(REPO, name) and m == "GET"]
    assert os.path.getsize(tmp_path / "moepack-source.json") > 0


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A real tiny Mixtral checkpoint (tests/tiny_models.py)."""
    from tiny_models import make_checkpoint

    src = tmp_path_factory.mktemp("ckpt")
    make_checkpoint("mixtral", src)
    return {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}


@pytest.fixture
def tiny_hub(tiny_files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch):
    with HubServer({"org/tiny-mixtral": HubRepo(tiny_files)}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        yield server


def test_dry_run_conversion_size_is_the_planners(tiny_hub: HubServer, tmp_path: Path) -> None:
    from moepack.convert.plan import plan_for_config
    from moepack.convert.settings import Settings

    files = tiny_hub.repos["org/tiny-mixtral"].files
    out = tmp_path / "elsewhere" / "m.moepack"
    plan = plan_hub("hf:org/tiny-mixtral", tmp_path / "raw", [], out)
    weights = [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
               for n, b in sorted(files.items()) if n.endswith(".safetensors")]
    blobs = {n: len(b) for n, b in files.items() if n in ("tokenizer.json",
                                                         "tokenizer_config.json",
                                                         "generation_config.json")}
    expected = plan_for_config(json.loads(files["config.json"]), Settings(), files=weights,
                               blobs=blobs).file_size
    assert plan.conversion == expected and "exact" in plan.conversion_note
    # Same filesystem for download and --out here, so one verdict adds both up.
    (v,) = plan.verdicts
    assert v.need == plan.to_fetch + expected and "conversion output" in v.label


@pytest.mark.timeout(120)
def test_fetched_checkpoint_converts_to_the_predicted_size(tiny_hub: HubServer,
                                                           tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "m.moepack"
    plan = plan_hub("hf:org/tiny-mixtral", raw, [], out)
    fetch_hub(plan, jobs=2, policy=FAST)
    r = CliRunner().invoke(app, ["convert", str(raw), str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size == plan.conversion
    assert CliRunner().invoke(app, ["verify", "--source", str(raw)]).exit_code == 0


def test_stalled_listing_is_bounded(hub: HubServer, tmp_path: Path) -> None:
    hub.faults[f"/api/models/{REPO}/tree/{hub.repos[REPO].commit}"] = Fault("stall", times=-1)
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=f"{REPO}@main"):
        plan_hub(f"hf:{REPO}", tmp_path, [], list_timeout=1.0)
    assert time.monotonic() - t0 < 10


def test_first_failure_stops_the_rest(hub: HubServer, tmp_path: Path) -> None:
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    hub.inject(REPO, first, Fault("404", times=-1, delay=0.3))   # let the other one start
    hub.inject(REPO, second, Fault("stall", times=-1, at=50_000))
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=f"{first}: not found") as err:
        fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, ["*.safetensors"]), jobs=2, policy=FAST)
    # Without the stop, the stalled file would run its 5 retries and fail on its own.
    assert "more failed" not in str(err.value) and time.monotonic() - t0 < 2.5
    assert (tmp_path / f"{second}.incomplete").stat().st_size == 50_000, "kept for resume"


def test_one_fetch_per_destination(hub: HubServer, tmp_path: Path) -> None:
    from moepack.fetch.lock import dest_lock

    plan = plan_hub(f"hf:{REPO}", tmp_path, ["*.json"])
    with dest_lock(tmp_path), pytest.raises(FetchError, match="another moepack fetch"):
        fetch_hub(plan, policy=FAST)
    fetch_hub(plan, policy=FAST)   # released


def test_cli_download(hub: HubServer, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["fetch", f"hf:{REPO}@main", "--dest", str(tmp_path),
                                 "--jobs", "2", "--stall-timeout", "5"])
    assert r.exit_code == 0, r.output
    assert "4 files verified by size and hash" in r.output
    assert json.loads((tmp_path / "moepack-source.json").read_text())["repo"] == REPO
    bad = CliRunner().invoke(app, ["fetch", "hf:org/missing", "--dest", str(tmp_path)])
    assert bad.exit_code == 1 and "org/missing@main" in bad.output


def test_dry_run_sees_whether_declared_mtp_layers_are_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config declaring a multi-token-prediction layer the checkpoint does not hold (what
    save_pretrained writes): the safetensors index says so, and the predicted size is the
    container convert writes, not one with the layer."""
    from moepack.convert.plan import plan_for_config
    from moepack.convert.settings import Settings
    from tiny_models import make_checkpoint

    src = make_checkpoint("deepseek_v3", tmp_path / "src", num_nextn_predict_layers=1)
    files = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    with HubServer({"org/tiny-ds": HubRepo(files)}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        plan = plan_hub("hf:org/tiny-ds", tmp_path / "raw", [], tmp_path / "m.moepack")
    config = json.loads(files["config.json"])
    weights = [{"name": n, "size": len(b)} for n, b in files.items() if n.endswith(".safetensors")]
    blobs = {n: len(b) for n, b in files.items() if n in ("tokenizer.json",
                                                         "tokenizer_config.json",
                                                         "generation_config.json")}
    names = json.loads(files["model.safetensors.index.json"])["weight_map"]
    held = plan_for_config(config, Settings(), weights, blobs, names).file_size
    assumed = plan_for_config(config, Settings(), weights, blobs).file_size
    assert plan.conversion == held < assumed


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_busy_answers_are_retried(hub: HubServer, tmp_path: Path, status: int) -> None:
    name = "model-00001-of-00002.safetensors"
    busy = Body(b"busy", status, {"Retry-After": "0"}, "text/plain")
    hub.inject(REPO, name, Fault("answer", times=2, answer=busy))
    fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, [name]), policy=FAST)
    assert (tmp_path / name).read_bytes() == _files()[name]
    gets = [p for (m, p, _) in hub.requests if p == hub.fault_path(REPO, name) and m == "GET"]
    assert len(gets) == 3


def test_retry_after_is_waited_out(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    busy = Body(b"slow down", 429, {"Retry-After": "1"}, "text/plain")
    hub.inject(REPO, name, Fault("answer", times=1, answer=busy))
    t0 = time.monotonic()
    fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, [name]), policy=FAST)
    assert time.monotonic() - t0 >= 1.0


def test_persistent_5xx_names_the_url_that_answered(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    cdn = hub.fault_path(REPO, name)   # the hub redirects there; the CDN is what fails
    hub.inject(REPO, name, Fault("answer", times=-1, answer=Body(b"", 503, {}, "text/plain")))
    with pytest.raises(FetchError, match=rf"{name}: HTTP 503 from {hub.base}{cdn} after 6 tries"):
        fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, [name]), policy=FAST)


def test_redirect_loop_is_one_line(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    cdn = hub.fault_path(REPO, name)
    loop = Body(b"", 302, {"Location": f"{hub.base}{cdn}"}, "text/plain")
    hub.inject(REPO, name, Fault("answer", times=-1, answer=loop))
    r = CliRunner().invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path),
                                 "--include", name])
    assert r.exit_code == 1 and "too many redirects" in r.output, r.output


def test_a_folder_at_a_file_name_is_refused_before_downloading(hub: HubServer,
                                                               tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    (tmp_path / name).mkdir()
    runner = CliRunner()
    dry = runner.invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path), "--dry-run"])
    assert dry.exit_code == 1 and "is a folder" in dry.output, dry.output
    r = runner.invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path)])
    assert r.exit_code == 1 and "is a folder" in r.output, r.output
    assert not [p for (m, p, _) in hub.requests if m == "GET" and "/cdn/" in p]


class _Bar:
    """What a progress bar is told: the running byte count, its highest point, the lines said."""

    def __init__(self) -> None:
        self.done = self.peak = 0
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def on_bytes(self, n: int) -> None:
        with self._lock:
            self.done += n
            self.peak = max(self.peak, self.done)

    def say(self, line: str) -> None:
        self.lines.append(line)


def _fetch_watched(hub: HubServer, dest: Path, name: str) -> _Bar:
    bar = _Bar()
    plan = plan_hub(f"hf:{REPO}", dest, [name])
    fetch_hub(plan, policy=FAST, on_bytes=bar.on_bytes, say=bar.say)
    assert (dest / name).read_bytes() == _files()[name]
    assert bar.peak == bar.done == plan.listing.total, "the bar ends at its total, never past"
    return bar


def test_a_file_fetched_again_after_a_bad_hash_keeps_the_bar_truthful(hub: HubServer,
                                                                      tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    hub.inject(REPO, name, Fault("corrupt", times=1, at=5000))
    bar = _fetch_watched(hub, tmp_path, name)
    (line,) = bar.lines
    assert name in line and "SHA-256" in line and "2 of 2" in line, line


def test_a_server_ignoring_range_keeps_the_bar_truthful(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    (tmp_path / f"{name}.incomplete").write_bytes(_files()[name][:100_000])
    hub.inject(REPO, name, Fault("ignore-range", times=1))
    bar = _fetch_watched(hub, tmp_path, name)
    (line,) = bar.lines
    assert name in line and "Range" in line and hub.fault_path(REPO, name) in line, line


def test_busy_answers_and_truncated_bodies_are_said_once_each(hub: HubServer,
                                                             tmp_path: Path) -> None:
    name = "model-00001-of-00002.safetensors"
    cdn = hub.base + hub.fault_path(REPO, name)
    busy = Body(b"busy", 503, {"Retry-After": "0"}, "text/plain")
    hub.inject(REPO, name, Fault("answer", times=2, answer=busy))
    bar = _fetch_watched(hub, tmp_path / "busy", name)
    assert len(bar.lines) == 2, bar.lines
    for n, line in enumerate(bar.lines, start=2):
        assert line.startswith(f"{name}: HTTP 503 from {cdn}; try {n} of 6"), line
    hub.inject(REPO, name, Fault("drop", times=1, at=100_000))
    bar = _fetch_watched(hub, tmp_path / "drop", name)
    (line,) = bar.lines
    assert line.startswith(f"{name}: ") and "100000 of 262144 bytes" in line, line


def test_cli_says_a_re_download_in_one_line(hub: HubServer, tmp_path: Path) -> None:
    name = "model-00002-of-00002.safetensors"
    hub.inject(REPO, name, Fault("corrupt", times=1, at=5000))
    r = CliRunner().invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path),
                                 "--include", name])
    assert r.exit_code == 0, r.output
    said = [ln for ln in r.output.splitlines() if "downloading it again" in ln]
    assert len(said) == 1 and said[0].startswith(f"{name}: SHA-256"), r.output


def test_a_same_size_file_on_disk_counts_the_space_a_new_download_needs(
        hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Right size, other content: hashed at fetch, then downloaded next to the old copy."""
    name = "model-00001-of-00002.safetensors"
    size = len(_files()[name])
    (tmp_path / name).write_bytes(bytes(size))
    plan = plan_hub(f"hf:{REPO}", tmp_path, [name])
    assert [s.status for s in plan.files] == [UNVERIFIED]
    assert plan.verdicts[0].need == size
    dry = CliRunner().invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path), "--include",
                                   name, "--dry-run"])
    (row,) = [ln for ln in dry.output.splitlines() if "model-00001" in ln]
    assert dry.exit_code == 0 and "≤" in row, dry.output
    monkeypatch.setattr(space, "free_bytes", lambda path: size)   # short of the 5 % margin
    r = CliRunner().invoke(app, ["fetch", f"hf:{REPO}", "--dest", str(tmp_path), "--include",
                                 name])
    assert r.exit_code == 1 and "not enough free space" in r.output, r.output
    assert (tmp_path / name).read_bytes() == bytes(size), "nothing touched"


def test_room_for_re_downloads_counts_as_many_files_as_run_at_once(hub: HubServer,
                                                                  tmp_path: Path) -> None:
    sizes = {n: len(b) for n, b in _files().items() if n.endswith(".safetensors")}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(bytes(size))
    one = plan_hub(f"hf:{REPO}", tmp_path, ["*.safetensors"], jobs=1)
    both = plan_hub(f"hf:{REPO}", tmp_path, ["*.safetensors"], jobs=2)
    assert one.verdicts[0].need == max(sizes.values())
    assert both.verdicts[0].need == sum(sizes.values())


def test_a_plain_file_verified_at_another_revision_is_not_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub gives plain files no SHA-256: the record must hold the blob hash it checked."""
    files = _files()
    newer = dict(files, **{"config.json": json.dumps({"model_type": "mixtrax"}).encode()})
    assert len(newer["config.json"]) == len(files["config.json"])
    for content, commit in ((files, "1" * 40), (newer, "2" * 40)):
        with HubServer({REPO: HubRepo(content, commit=commit)}) as server:
            monkeypatch.setenv("HF_ENDPOINT", server.base)
            plan = plan_hub(f"hf:{REPO}", tmp_path, ["config.json"])
            fetch_hub(plan, policy=FAST)
    assert [s.status for s in plan.files] == [UNVERIFIED]
    assert (tmp_path / "config.json").read_bytes() == newer["config.json"]


def test_two_fetch_processes_into_one_dest(hub: HubServer, tmp_path: Path) -> None:
    """Real processes: the second is refused in one line naming the first, which completes."""
    import re
    import subprocess
    import sys

    big = "model-00001-of-00002.safetensors"
    hub.inject(REPO, big, Fault("slow", delay=4.0))   # keeps the first fetch running
    env = {**os.environ, "HF_ENDPOINT": hub.base}
    cmd = [sys.executable, "-m", "moepack", "fetch", f"hf:{REPO}", "--dest", str(tmp_path)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(p == hub.fault_path(REPO, big) for _, p, _ in hub.requests):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        assert first.poll() is None, "the first fetch ended before the second was checked"
        err = second.stderr.strip().splitlines()
        assert second.returncode == 1 and len(err) == 1, second.stderr
        assert re.search(rf"another moepack fetch is writing here \(process {first.pid} holds",
                         err[0]), err[0]
        assert first.wait(timeout=30) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    for name, data in _files().items():
        assert (tmp_path / name).read_bytes() == data


def test_fetch_planned_before_another_finished_downloads_nothing_again(
        hub: HubServer, tmp_path: Path) -> None:
    """A fetch whose plan was made while another fetch into DEST was still running, and which
    gets the lock once that one is done: before, it downloaded every file again (the plan said
    missing) and rewrote the verified record from its stale copy."""
    late = plan_hub(f"hf:{REPO}", tmp_path, [])
    fetch_hub(plan_hub(f"hf:{REPO}", tmp_path, []), policy=FAST)   # the other one, finished
    record = (tmp_path / ".moepack-partial" / "hub-verified.json").read_bytes()
    seen = len(hub.requests)
    result = fetch_hub(late, policy=FAST)
    content = [r for r in hub.requests[seen:]
               if r[0] == "GET" and ("/cdn/" in r[1] or "/resolve/" in r[1])]
    assert content == [], content
    assert result.files == len(_files())
    assert (tmp_path / ".moepack-partial" / "hub-verified.json").read_bytes() == record
