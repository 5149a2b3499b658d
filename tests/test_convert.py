"""`moepack convert`: every architecture, reproducibility across --jobs, resume after SIGKILL,
refusals (settings/source changed, existing output, no space), damaged sources."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from moepack.convert import pipeline
from moepack.convert.adapters import adapter_for
from moepack.convert.errors import ConvertError
from moepack.convert.pipeline import convert
from moepack.convert.plan import plan_for_config
from moepack.convert.progress import Reporter
from moepack.convert.settings import Settings
from moepack.convert.source import Checkpoint, SourceRef
from moepack.format import Container
from tiny_models import ARCHS, make_checkpoint

FAST = Settings(expert_preset="rvq3-baseline", iters=3)  # small k-means: the tests stay fast


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("conv-src")
    return {arch: make_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def reference(sources, tmp_path_factory):
    """An uninterrupted --jobs 1 conversion of each architecture."""
    root = tmp_path_factory.mktemp("conv-ref")
    return {arch: (convert(src, root / f"{arch}.moepack", FAST), root / f"{arch}.moepack")
            for arch, src in sources.items()}


class StopAfter(Reporter):
    """Interrupts the conversion (like Ctrl-C) once `n` experts are done."""

    def __init__(self, n: int) -> None:
        self.n = n

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        self.n -= experts
        if self.n <= 0:
            raise KeyboardInterrupt


def _interrupted(src: Path, out: Path, n: int = 2, settings: Settings = FAST,
                 pause_per_unit: float = 0.0) -> None:
    with pytest.raises(KeyboardInterrupt):
        convert(src, out, settings, reporter=StopAfter(n), pause_per_unit=pause_per_unit)
    assert not out.exists() and out.with_name(out.name + ".partial").exists()
    assert out.with_name(out.name + ".journal").exists()


def _interrupted_inside_layer0(src: Path, out: Path, settings: Settings) -> None:
    """Stopped after layer 0's codebooks but before its last expert (a journal entry per unit),
    so the resume must read the codebooks back from the partial file."""
    _interrupted(src, out, n=1, settings=settings, pause_per_unit=1e-6)
    done = out.with_name(out.name + ".journal").read_text()
    assert '"tensor:layers.0.experts.down.codebook"' in done and '"expert:0:2"' not in done


@pytest.mark.parametrize("arch", ARCHS)
def test_convert_each_architecture(sources, reference, arch):
    summary, path = reference[arch]
    with Container.open(path) as c:
        assert c.id == summary.container_id and c.file_size == summary.file_size
        m = c.manifest
        assert m["model"]["arch"] == arch
        assert m["source"]["config"] == json.loads((sources[arch] / "config.json").read_text())
        assert [f["name"] for f in m["source"]["files"]] == Checkpoint(sources[arch]).files
        assert m["converter"]["settings"]["expert"]["iters"] == 3
        assert sorted(c.blob_names()) == ["generation_config.json", "tokenizer.json",
                                          "tokenizer_config.json"]
        assert c.blob("tokenizer.json") == (sources[arch] / "tokenizer.json").read_bytes()
        # trunk and experts decode close to the source weights
        ck = Checkpoint(sources[arch])
        norm = next(t for t in adapter_for(ck.config).trunk() if t.name == "final_norm")
        np.testing.assert_allclose(c.tensor("final_norm"),
                                   ck.read(SourceRef(norm.sources[0])), rtol=0, atol=0)
        bank = c.banks()[0]
        w = c.expert_part(bank["layer"], 1, "down")
        assert w.shape == tuple(bank["parts"][2]["shape"]) and np.all(np.isfinite(w))
    assert not path.with_name(path.name + ".journal").exists()


def test_plan_for_config_predicts_exact_size(sources, reference):
    for arch, src in sources.items():
        ck = Checkpoint(src)
        files = [{"name": f, "size": (src / f).stat().st_size} for f in ck.files]
        blobs = {n: (src / n).stat().st_size for n in ck.blob_files()}
        assert plan_for_config(ck.config, FAST, files, blobs, ck.tensors.keys()).file_size == \
            reference[arch][1].stat().st_size


def test_jobs_2_is_byte_identical(sources, reference, tmp_path):
    out = tmp_path / "j2.moepack"
    summary = convert(sources["deepseek_v3"], out, FAST, jobs=2)
    assert 10 << 20 < summary.peak_rss_worker < 2 << 30
    assert out.read_bytes() == reference["deepseek_v3"][1].read_bytes()


class KillAWorker(Reporter):
    """SIGKILLs one worker process (as the kernel's OOM killer would) once an expert is done."""

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        if experts and (workers := multiprocessing.active_children()):
            os.kill(workers[0].pid, signal.SIGKILL)


def test_a_killed_worker_stops_the_run_and_the_rerun_finishes(sources, reference, tmp_path):
    out = tmp_path / "w.moepack"
    with pytest.raises(ConvertError, match=r"worker moepack-convert-\d died \(exit code -9\); "
                                           r"out of memory\? rerun"):
        convert(sources["mixtral"], out, FAST, jobs=2, reporter=KillAWorker(),
                pause_per_unit=0.05)
    assert not out.exists()
    convert(sources["mixtral"], out, FAST, jobs=2)
    assert out.read_bytes() == reference["mixtral"][1].read_bytes()


def test_interrupted_then_resumed_is_byte_identical(sources, reference, tmp_path):
    out = tmp_path / "r.moepack"
    _interrupted(sources["qwen3_moe"], out, n=3)
    summary = convert(sources["qwen3_moe"], out, FAST)
    assert summary.resumed_units > 3
    assert out.read_bytes() == reference["qwen3_moe"][1].read_bytes()
    assert not out.with_name("r.moepack.journal").exists()
    assert not out.with_name("r.moepack.partial").exists()


def test_sigkill_then_resume_is_byte_identical(sources, reference, tmp_path):
    """A real `moepack convert` process (and its workers) killed mid-way, then rerun."""
    out = tmp_path / "k.moepack"
    journal = tmp_path / "k.moepack.journal"
    cmd = [sys.executable, "-m", "moepack", "convert", str(sources["mixtral"]), str(out),
           "--expert-codec", "rvq3-baseline", "--iters", "3", "--quiet", "--jobs", "2"]
    cmd += ["--pause-per-unit", "0.2"]
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if journal.exists() and journal.read_bytes().count(b"\n") >= 8:
                break
            assert proc.poll() is None, "conversion finished before it could be killed"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    lines = journal.read_bytes().count(b"\n")
    assert not out.exists() and 8 <= lines < 40
    summary = convert(sources["mixtral"], out, FAST)  # the same command, run again
    assert summary.resumed_units >= 7
    assert out.read_bytes() == reference["mixtral"][1].read_bytes()


def test_resume_with_other_settings_refuses_naming_them(sources, tmp_path):
    out = tmp_path / "s.moepack"
    _interrupted(sources["mixtral"], out)
    other = Settings(expert_preset="rvq3-baseline", iters=3, seed=7)
    with pytest.raises(ConvertError, match=r"settings\.seed: was 0, now 7.*--restart"):
        convert(sources["mixtral"], out, other)
    convert(sources["mixtral"], out, other, restart=True)  # discards the old partial
    with Container.open(out) as c:
        assert c.manifest["converter"]["settings"]["seed"] == 7


def test_resume_with_changed_source_refuses(sources, tmp_path):
    src = make_checkpoint("mixtral", tmp_path / "src")
    out = tmp_path / "c.moepack"
    _interrupted(src, out)
    make_checkpoint("mixtral", tmp_path / "src", seed=1)  # same names and sizes, other weights
    with pytest.raises(ConvertError, match=r"'model-00001-of-00002\.safetensors' has other "
                       r"contents.*--restart"):
        convert(src, out, FAST)


def test_existing_output_needs_force(sources, reference, tmp_path):
    out = tmp_path / "f.moepack"
    out.write_bytes(b"precious")
    with pytest.raises(ConvertError, match="already exists; pass --force"):
        convert(sources["mixtral"], out, FAST)
    assert out.read_bytes() == b"precious"
    convert(sources["mixtral"], out, FAST, force=True)
    assert out.read_bytes() == reference["mixtral"][1].read_bytes()


def test_dry_run_and_short_space_write_nothing(sources, reference, tmp_path, monkeypatch):
    out = tmp_path / "d.moepack"
    s = convert(sources["deepseek_v3"], out, FAST, dry_run=True)
    assert s.file_size == reference["deepseek_v3"][1].stat().st_size
    assert s.plan["peak_memory_estimate"] > 0 and s.container_id is None
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(pipeline.shutil, "disk_usage",
                        lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(ConvertError, match="not enough free space.*nothing was written"):
        convert(sources["deepseek_v3"], out, FAST)
    assert list(tmp_path.iterdir()) == []


def _cli(*args: str):
    """Run `moepack ...` in this process (a subprocess would pay the import time again)."""
    from typer.testing import CliRunner

    from moepack.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_json_and_damaged_source(tmp_path):
    src = make_checkpoint("mixtral", tmp_path / "src")
    out = tmp_path / "o.moepack"
    r = _cli("convert", str(src), str(out), "--json", "--expert-codec", "rvq3-baseline",
             "--iters", "2")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["file_size"] == out.stat().st_size and len(summary["container_id"]) == 64
    assert summary["expert_bits_per_weight"] > 0
    shard = sorted(src.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-50])
    bad = tmp_path / "bad.moepack"
    r = _cli("convert", str(src), str(bad))
    assert r.exit_code == 1
    assert shard.name in r.output and "truncated" in r.output and "tensor '" in r.output
    assert not bad.exists() and not (tmp_path / "bad.moepack.partial").exists()


def test_cli_dry_run_prints_plan(sources, tmp_path):
    r = _cli("convert", str(sources["qwen3_moe"]), str(tmp_path / "x.moepack"), "--dry-run",
             "--trunk-codec", "q4", "--codec", "embed=q8")
    assert r.exit_code == 0, r.output
    assert "plan for" in r.stdout and "peak memory estimate" in r.stdout
    assert "attn=q4" in r.stdout and "embed=q8" in r.stdout
    assert list(tmp_path.iterdir()) == []
    r = _cli("convert", str(sources["qwen3_moe"]), str(tmp_path / "x.moepack"), "--dry-run",
             "--expert-codec", "nope")
    assert r.exit_code == 2 and "'nope' is not an expert codec preset" in r.output


CONFIGS = Path(__file__).resolve().parent.parent / "docs" / "configs"


@pytest.mark.parametrize("stem", ["Kimi-K3", "DeepSeek-V3.2"])  # DeepSeek: an MTP layer kept
def test_dry_run_of_a_config_alone_is_the_planners_size(stem, tmp_path):
    """A folder with a real config.json and no weights: --dry-run says so and prints the exact
    size `plan --config` gives (planned from the config alone); converting it is refused in one
    line, with nothing written."""
    src, out = tmp_path / "src", tmp_path / "out.moepack"
    src.mkdir()
    (src / "config.json").write_bytes((CONFIGS / f"{stem}.json").read_bytes())
    want = plan_for_config(json.loads((src / "config.json").read_text()), Settings()).file_size
    r = _cli("convert", str(src), str(out), "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"no weights in {src}" in r.stdout and "planned from config.json alone" in r.stdout
    assert "expert preset rvq3-l" in r.stdout
    assert f"({want:,} bytes)" in r.stdout
    r = _cli("convert", str(src), str(out), "--dry-run", "--json")
    plan = json.loads(r.stdout)["plan"]
    assert plan["weightless"] is True and plan["file_size"] == want
    r = _cli("convert", str(src), str(out))
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert "no model.safetensors" in r.output and "--dry-run plans" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_second_concurrent_run_is_refused(sources, tmp_path):
    from moepack.convert.journal import Journal

    out = tmp_path / "l.moepack"
    _interrupted(sources["mixtral"], out)
    partial = (tmp_path / "l.moepack.partial").read_bytes()
    holder = Journal.resume(tmp_path / "l.moepack.journal")  # a run in progress holds the lock
    try:
        with pytest.raises(ConvertError, match="another conversion of this output is running"):
            convert(sources["mixtral"], out, FAST)
        with pytest.raises(ConvertError, match="another conversion"):
            convert(sources["mixtral"], out, FAST, restart=True)
    finally:
        holder.close()
    assert (tmp_path / "l.moepack.partial").read_bytes() == partial


def test_non_finite_source_weight_names_tensor(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = make_checkpoint("mixtral", tmp_path / "src")
    name = "model.layers.1.self_attn.o_proj.weight"
    fname = Checkpoint(src).info(name).file
    with safe_open(src / fname, "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    t[name][3, 4] = float("inf")
    save_file(t, src / fname)
    with pytest.raises(ConvertError, match=f"{fname}: tensor '{name}'"):
        convert(src, tmp_path / "o.moepack", FAST)
    assert not (tmp_path / "o.moepack").exists()


def test_banded_trunk_encoding_gives_same_bytes(sources, reference, tmp_path, monkeypatch):
    from moepack.convert import rowchunks

    monkeypatch.setattr(rowchunks, "ROW_MULTIPLE", 8)
    monkeypatch.setattr(rowchunks, "BAND_BYTES", 8 * 36 * 4)  # 8-row bands even for the embed
    out = tmp_path / "b.moepack"
    convert(sources["qwen3_moe"], out, FAST)
    assert out.read_bytes() == reference["qwen3_moe"][1].read_bytes()


def test_journal_drops_a_torn_last_line(tmp_path):
    from moepack.convert.journal import Journal, differences

    path = tmp_path / "x.journal"
    j = Journal.create(path, {"settings": {"seed": 0}})
    j.record([("tensor:embed", "aa"), ("expert:0:1", "bb")])
    j.close()
    with open(path, "ab") as f:
        f.write(b'{"u": "expert:0:2", "h"')  # killed in the middle of an append
    j = Journal.resume(path)
    assert j.done == {"tensor:embed": "aa", "expert:0:1": "bb"}
    j.record([("expert:0:2", "cc")])
    j.close()
    j = Journal.resume(path)
    assert j.done["expert:0:2"] == "cc"
    j.close()
    assert differences({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": 2, "c": [1, 3]}}) == \
        ["a.b: was 1, now 2", "a.c[1]: was 2, now 3"]


def test_damaged_partial_units_are_redone_on_resume(sources, reference, tmp_path):
    out = tmp_path / "d.moepack"
    _interrupted(sources["deepseek_v3"], out, n=4)
    partial = tmp_path / "d.moepack.partial"
    with Container.open(reference["deepseek_v3"][1]) as c:
        layer = c.banks()[0]["layer"]
        off, _ = c.expert_range(layer, 0)
        emb = c.tensor_info("embed")
    with open(partial, "r+b") as f:  # flip bytes of a finished expert and of the embedding
        f.seek(off + 10)
        f.write(b"\xff\xfe")
        f.seek(emb["offset"])
        f.write(b"\x00\x01\x02")
    messages: list[str] = []
    capture = Reporter()
    capture.message = messages.append  # type: ignore[method-assign]
    convert(sources["deepseek_v3"], out, FAST, reporter=capture)
    assert any("; 2 damaged, redoing them" in m for m in messages), messages
    assert out.read_bytes() == reference["deepseek_v3"][1].read_bytes()


def test_rotated_codec_resume_and_layout(sources, tmp_path):
    """rvq3-hadamard adds `.rotation` tensors: planned after the codebooks, read back on resume."""
    rot = Settings(expert_preset="rvq3-hadamard", iters=2, sample=2000)
    ref = tmp_path / "ref.moepack"
    convert(sources["qwen3_moe"], ref, rot)
    with Container.open(ref) as c:
        names = [s["name"] for s in c.sections if s["name"].startswith("layers.0.experts.")]
        assert names == [f"layers.0.experts.{p}.{k}" for k in ("codebook", "rotation")
                         for p in ("gate", "up", "down")]
        assert c.bank(0)["parts"][0]["codec"]["rotation"] == "hadamard"
    out = tmp_path / "r.moepack"
    _interrupted(sources["qwen3_moe"], out, n=2, settings=rot)
    convert(sources["qwen3_moe"], out, rot)
    assert out.read_bytes() == ref.read_bytes()


def test_mixed_stage_codec_resume_and_manifest(sources, tmp_path):
    """rvq3-m: 4 stages on down only; its 4-stage codebook is read back right on resume, and
    a resume asking for plain rvq3 is refused (part_stages is a byte-influencing setting)."""
    mixed = Settings(expert_preset="rvq3-m", iters=2, sample=2000)
    ref = tmp_path / "ref.moepack"
    convert(sources["mixtral"], ref, mixed)
    with Container.open(ref) as c:
        stages = {p["name"]: p["codec"]["stages"] for p in c.bank(0)["parts"]}
        assert stages == {"gate": 3, "up": 3, "down": 4}
        assert c.manifest["converter"]["settings"]["expert"]["part_stages"] == {"down": 4}
        assert c.tensor("layers.0.experts.down.codebook").shape == (4, 256, 8)
    out = tmp_path / "r.moepack"
    _interrupted_inside_layer0(sources["mixtral"], out, mixed)
    with pytest.raises(ConvertError, match="part_stages"):
        convert(sources["mixtral"], out, Settings(expert_preset="rvq3", iters=2, sample=2000))
    convert(sources["mixtral"], out, mixed)  # the 4-stage codebook comes from the partial file
    assert out.read_bytes() == ref.read_bytes()


def test_f16_codebooks_jobs_resume_and_codes(sources, tmp_path):
    """--codec codebook=f16: codebooks stored as f16 (rotations stay f32); experts are encoded
    against the rounded codebook (re-encoding a source expert with the stored codebook gives the
    stored bytes); --jobs 2 and a resume that reads the f16 codebooks back give the same bytes."""
    from moepack.convert.quant import encode

    f16 = Settings(expert_preset="rvq3-hadamard", iters=2, sample=2000,
                   trunk=(("codebook", "f16"),))
    ref = tmp_path / "ref.moepack"
    convert(sources["mixtral"], ref, f16)
    with Container.open(ref) as c:
        assert c.manifest["codecs"]["codebook"] == {"name": "f16"}
        cb_info = c.tensor_info("layers.0.experts.down.codebook")
        assert cb_info["codec"] == {"name": "f16"} and cb_info["length"] == 3 * 256 * 8 * 2
        assert c.tensor_info("layers.0.experts.down.rotation")["codec"] == {"name": "f32"}
        cb = c.tensor("layers.0.experts.down.codebook")
        signs = c.tensor("layers.0.experts.down.rotation")
        w = Checkpoint(sources["mixtral"]).read(
            SourceRef("model.layers.0.block_sparse_moe.experts.1.w2.weight"))
        codec = c.bank(0)["parts"][2]["codec"]
        again = encode(codec, w, codebook=cb, rotation=signs, settings=f16.rvq)
        assert again == bytes(c.expert_part_bytes(0, 1, "down"))
    out = tmp_path / "j2.moepack"
    convert(sources["mixtral"], out, f16, jobs=2)
    assert out.read_bytes() == ref.read_bytes()
    out = tmp_path / "r.moepack"
    _interrupted_inside_layer0(sources["mixtral"], out, f16)
    convert(sources["mixtral"], out, f16)  # layer 0's codebooks come from the partial file
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("codec", ["q8", "bf16"])
def test_codebook_codec_other_than_f32_f16_is_refused(sources, codec):
    ck = Checkpoint(sources["mixtral"])
    with pytest.raises(ConvertError, match="not allowed for class 'codebook'.*f32, f16"):
        plan_for_config(ck.config, Settings(trunk=(("codebook", codec),)))
