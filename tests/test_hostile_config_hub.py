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
