"""`moepack fetch hf:… --dry-run` plans a conversion from the hub's config.json, which is
untrusted: the converter's bounds and rules apply (fetch/hub_conversion.py), the size is reported
unknown with one line saying why, nothing is written, and a hostile config cannot make the plan
allocate (run under `ulimit -v`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_snapshot import assert_one_line_error, cli, snapshot
from hostile_sources import MIXTRAL, mixtral_tensors, safetensors_bytes
from hub_server import HubRepo, HubServer

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]
REPO = "org/hostile"
VMEM_KB = 4_000_000

HOSTILE = {
    "layers": (json.dumps({**MIXTRAL, "num_hidden_layers": 10**9}).encode(),
               "config.json: 'num_hidden_layers' must be an integer in 1..4096, got 1000000000"),
    "top-k": (json.dumps({**MIXTRAL, "num_experts_per_tok": 0}).encode(),
              "config.json: 'num_experts_per_tok' must be an integer in 1..65536, got 0"),
    "theta": (json.dumps({**MIXTRAL, "rope_theta": -1}).encode(),
              "config.json: 'rope_theta' must be a finite number > 1, got -1.0"),
    "nested": (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
               "config.json unreadable: config.json: JSON nested deeper than 64 levels"),
    "list": (b"[1, 2]", "config.json unreadable: not a JSON object"),
}


def _dry_run(tmp_path: Path, config: bytes) -> tuple[int, str]:
    files = {"config.json": config, "model.safetensors": safetensors_bytes(mixtral_tensors())}
    with HubServer({REPO: HubRepo(files)}) as server:
        cmd = [sys.executable, "-m", "moepack", "fetch", f"hf:{REPO}", "--dest",
               str(tmp_path / "dl"), "--dry-run"]
        cmd = ["bash", "-c", f'ulimit -v {VMEM_KB}; exec "$@"', "bash", *cmd]
        env = {**os.environ, "HF_ENDPOINT": server.base, "COLUMNS": "400"}
        env.pop("HF_TOKEN", None)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_hub_config_gives_one_line(tmp_path: Path, case: str) -> None:
    config, reason = HOSTILE[case]
    rc, output = _dry_run(tmp_path, config)
    assert "Traceback" not in output, output
    lines = [ln for ln in output.splitlines() if ln.startswith("conversion output")]
    assert lines == [f"conversion output: unknown — planner: {reason}"] or \
        lines == [f"conversion output: unknown — {reason}"], output
    assert rc in (0, 1), output
    assert not (tmp_path / "dl").exists() or not any((tmp_path / "dl").iterdir())


def test_conversion_size_of_a_valid_config_is_known(tmp_path: Path) -> None:
    rc, output = _dry_run(tmp_path, json.dumps(MIXTRAL).encode())
    assert rc == 0 and "conversion output: unknown" not in output, output


def test_a_planner_bug_is_raised_not_shown_as_the_configs_fault(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Only the planner's refusals become the reason shown; a TypeError is a bug."""
    from moepack.convert import plan as convert_plan
    from moepack.fetch.hub_conversion import conversion_size
    from moepack.fetch.hub_listing import RemoteFile, RepoListing

    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    listing = RepoListing("org/m", "0" * 40, (RemoteFile("config.json", 1, None, "0" * 40),))
    assert conversion_size(listing, tmp_path)[0]  # the control: a size from the local copy

    def bug(*args, **kwargs):
        raise TypeError("a bug in the planner")

    monkeypatch.setattr(convert_plan, "plan_for_config", bug)
    with pytest.raises(TypeError, match="a bug in the planner"):
        conversion_size(listing, tmp_path)


# -- `convert hf:… --staging` / `--ray`: the hub's safetensors index is untrusted too ---------

INDEX = "model.safetensors.index.json"
A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
TENSORS = list(mixtral_tensors().items())
SHARDS = {A: dict(TENSORS[:5]), B: dict(TENSORS[5:])}
WEIGHT_MAP = {t: f for f, part in SHARDS.items() for t in part}
FIRST = TENSORS[0][0]


def _sharded(weight_map: object = WEIGHT_MAP, *, index: bytes | None = None,
             drop: tuple[str, ...] = (), **extra: bytes) -> dict[str, bytes]:
    """The tiny Mixtral in two shards with an index whose weight_map is `weight_map` (or whose
    bytes are `index`), files `drop` left out and `extra` added."""
    doc = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    files = {"config.json": json.dumps(MIXTRAL).encode(), INDEX: doc if index is None else index,
             **{f: safetensors_bytes(t) for f, t in SHARDS.items()}, **extra}
    return {n: d for n, d in files.items() if n not in drop}


_TWICE = json.dumps({"weight_map": WEIGHT_MAP})[:-2] + f', "{FIRST}": "{B}"}}}}'
HOSTILE_INDEX = {   # case: (repository files, the one line's text)
    "weight_map empty": (_sharded({}), f"{INDEX}: weight_map is empty: it names no tensors"),
    "weight_map null": (_sharded(None), f"{INDEX}: no weight_map object"),
    "shard a number": (_sharded({**WEIGHT_MAP, FIRST: 7}),
                       f"{INDEX}: weight_map values must be file names"),
    "shard not listed": (_sharded({**WEIGHT_MAP, FIRST: "model-3.safetensors"}),
                         f"hf:{REPO}: model-3.safetensors is listed in {INDEX} but not in the "
                         "repository"),
    "shard in a folder": (_sharded({**WEIGHT_MAP, FIRST: "sub/x.safetensors"},
                                   **{"sub/x.safetensors": safetensors_bytes(SHARDS[A])}),
                          f"{INDEX}: 'sub/x.safetensors' is not a file name"),
    "shard ..": (_sharded({**WEIGHT_MAP, FIRST: f"../{A}"}), f"'../{A}' is not a file name"),
    "shard config.json": (_sharded({**WEIGHT_MAP, FIRST: "config.json"}),
                          f"{INDEX}: weight_map names config.json, which is not a weight shard"),
    "tensor listed twice": (_sharded(index=_TWICE.encode()),
                            f"{B}: has no tensor {FIRST!r} although {INDEX} says so"),
    "no config.json": (_sharded(drop=("config.json",)),
                       f"hf:{REPO}: no config.json in the repository"),
    "no weights": (_sharded(drop=(INDEX, A, B)),
                   f"hf:{REPO}: no model.safetensors and no {INDEX} in the repository"),
}
MODES = {"staging dry run": ("--staging", "1M", "--dry-run"), "staging": ("--staging", "1M"),
         "ray dry run": ("--ray", "127.0.0.1:1", "--dry-run")}
# Every case converting; the dry runs share its planning (one case each: ~0.5 s a run).
RUNS = [(c, "staging") for c in sorted(HOSTILE_INDEX)] + \
    [("weight_map empty", "staging dry run"), ("weight_map empty", "ray dry run")]


@pytest.mark.parametrize("case,mode", RUNS)
def test_hostile_hub_index_gives_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          case: str, mode: str) -> None:
    """Exit 1 with one line, and no OUT, no OUT.staging: the refusal comes before any shard
    is downloaded, so the staging folder this run created goes too."""
    files, needle = HOSTILE_INDEX[case]
    before = snapshot(tmp_path)
    with HubServer({REPO: HubRepo(dict(files))}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        rc, output = cli("convert", f"hf:{REPO}", tmp_path / "m.moepack", *MODES[mode])
    assert_one_line_error(rc, output, 1, needle)
    assert snapshot(tmp_path) == before


def test_the_sharded_control_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unmodified two-shard repository of the table plans (so each row fails by its one
    defect), and the dry run keeps its staging folder of stand-ins for the real run."""
    with HubServer({REPO: HubRepo(_sharded())}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        rc, output = cli("convert", f"hf:{REPO}", tmp_path / "m.moepack", *MODES["staging dry run"])
    assert rc == 0 and "peak disk:" in output, output
    assert sorted(p.name for p in (tmp_path / "m.moepack.staging").iterdir() if p.is_file()) \
        == sorted(["config.json", INDEX, A, B])
