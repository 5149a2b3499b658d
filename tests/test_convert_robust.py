"""`moepack convert` robustness: a damaged codebook in the partial, OUT naming a source file or a
directory, a source changed during the run, what --dry-run says about a partial and free space,
and an INT4 `weight_shape` refused before anything is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from moepack.convert import pipeline
from moepack.convert.errors import ConvertError
from moepack.convert.journal import Journal
from moepack.convert.pipeline import convert
from moepack.convert.plan import checkpoint_plan
from moepack.convert.progress import Reporter
from moepack.convert.settings import Settings
from moepack.convert.source import Checkpoint
from tiny_models import make_checkpoint

FAST = Settings(expert_preset="rvq3-baseline", iters=3)
LAYER_EXPERTS = 3  # the tiny mixtral: 2 layers of 3 experts


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_checkpoint("mixtral", tmp_path_factory.mktemp("robust-src") / "mixtral")


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("robust-ref") / "ref.moepack"
    convert(src, out, FAST)
    return out.read_bytes()


class Recorder(Reporter):
    """Keeps messages and counts experts; interrupts (like Ctrl-C) once `stop` experts are done."""

    def __init__(self, stop: int | None = None) -> None:
        self.stop_at, self.experts, self.messages = stop, 0, []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        self.experts += experts
        if self.stop_at is not None and self.experts >= self.stop_at:
            raise KeyboardInterrupt


def _interrupted(src: Path, out: Path, experts: int) -> None:
    with pytest.raises(KeyboardInterrupt):
        convert(src, out, FAST, reporter=Recorder(experts))
    assert not out.exists() and _partial(out).exists() and _journal(out).exists()


def _partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _journal(out: Path) -> Path:
    return out.with_name(out.name + ".journal")


def _flip(path: Path, offset: int, n: int = 8) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


# -- 1. a damaged codebook of a finished layer
@pytest.mark.parametrize(("part", "jobs"), [("gate", 1), ("down", 2)])
def test_damaged_codebook_of_a_finished_layer_is_retrained_with_its_experts(
        src, reference, tmp_path, part, jobs):
    out = tmp_path / "c.moepack"
    _interrupted(src, out, LAYER_EXPERTS)  # layer 0 finished, layer 1 not started
    journal = _journal(out).read_text()
    assert f'"expert:0:{LAYER_EXPERTS - 1}"' in journal and '"expert:1:0"' not in journal
    plan, _ = checkpoint_plan(Checkpoint(src), FAST)
    _flip(_partial(out), plan.layout.tensor(f"layers.0.experts.{part}.codebook").offset + 8)
    rep = Recorder()
    convert(src, out, FAST, reporter=rep, jobs=jobs)
    want = f"1 damaged and the {LAYER_EXPERTS} experts encoded with their codebooks, redoing"
    assert any(want in m for m in rep.messages), rep.messages
    assert rep.experts == 2 * LAYER_EXPERTS  # layer 0's experts depend on the codebook: redone
    assert out.read_bytes() == reference and not _journal(out).exists()


def test_forgotten_units_stay_forgotten_after_a_reopen(tmp_path):
    """Units redone because what they depend on was damaged must not count as done if the
    redoing run is interrupted in its turn."""
    path = tmp_path / "j"
    j = Journal.create(path, {"x": 1})
    j.record([("expert:0:0", "aa"), ("expert:0:1", "bb")])
    j.forget(["expert:0:0"])
    j.close()
    assert Journal.read_done(path) == {"expert:0:1": "bb"}
    j = Journal.resume(path)
    assert j.done == {"expert:0:1": "bb"}
    j.record([("expert:0:0", "cc")])
    j.close()
    assert Journal.resume(path).done == {"expert:0:1": "bb", "expert:0:0": "cc"}


def test_units_never_written_is_a_bug_not_a_convert_error(src, tmp_path):
    """If an executor skips work, the run stops as an internal error (exit 3), not as a
    refusal the user could act on."""
    from moepack.cli import EXIT_BUG, _unexpected

    with pytest.raises(RuntimeError, match="29 units never written") as e:
        convert(src, tmp_path / "n.moepack", FAST,
                execute=lambda cfg, tasks, done, on_message: None)
    assert _unexpected(e.value) == EXIT_BUG


def test_ctrl_c_inside_a_native_call_is_an_interruption(src, tmp_path, monkeypatch):
    """Ctrl-C while ctypes converts arguments arrives as ctypes.ArgumentError: still "interrupted;
    rerun", never a traceback, and the rerun finishes."""
    import ctypes

    from moepack.convert.worker import Worker

    def run(self, task, done):
        raise ctypes.ArgumentError("argument 3: KeyboardInterrupt: ")

    out = tmp_path / "i.moepack"
    with monkeypatch.context() as m:
        m.setattr(Worker, "run", run)
        with pytest.raises(KeyboardInterrupt):
            convert(src, out, FAST)
    assert _partial(out).exists() and _journal(out).exists()
    convert(src, out, FAST)
    assert out.exists()


# -- 2. OUT is a file the conversion reads
def _victim(tmp_path: Path, src: Path) -> Path:
    victim = tmp_path / "victim"
    shutil.copytree(src, victim)
    return victim


def test_out_naming_a_source_file_is_refused_even_with_force(src, tmp_path):
    victim = _victim(tmp_path, src)
    shard = sorted(victim.glob("*.safetensors"))[-1]
    link = tmp_path / "link.moepack"
    link.symlink_to(shard)
    hard = tmp_path / "hard.moepack"
    os.link(shard, hard)
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    for out in (shard, victim / "config.json", victim / "tokenizer.json", link, hard,
                victim / ".." / victim.name / shard.name):
        if not out.exists():
            continue
        for dry in (False, True):
            with pytest.raises(ConvertError, match="is the source's .* choose another OUT"):
                convert(victim, out, FAST, force=True, dry_run=dry)
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before


def test_out_whose_partial_or_journal_is_a_source_file_is_refused(src, tmp_path):
    victim = _victim(tmp_path, src)
    # Not a file the conversion reads: OUT next to the source files is fine.
    assert convert(victim, victim / "x.moepack", FAST, dry_run=True).file_size > 0
    shard = sorted(victim.glob("*.safetensors"))[0]
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    out = tmp_path / "o.moepack"
    for suffix, name in ((".journal", "config.json"), (".partial", shard.name)):
        link = out.with_name(out.name + suffix)
        os.link(victim / name, link)  # a hard link: Journal.create would truncate config.json
        with pytest.raises(ConvertError, match=f"{link.name} is the source's {name}"):
            convert(victim, out, FAST)
        link.unlink()
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before


def test_cli_refuses_a_source_shard_as_out_in_one_line(src, tmp_path):
    victim = _victim(tmp_path, src)
    shard = sorted(victim.glob("*.safetensors"))[-1]
    before = shard.read_bytes()
    r = _cli("convert", str(victim), str(shard), "--force", "--expert-codec", "rvq3-baseline")
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert "choose another OUT" in r.output and shard.read_bytes() == before


# -- 3. OUT is a directory
def test_out_that_is_a_directory_is_refused_up_front(src, tmp_path):
    out = tmp_path / "dir.moepack"
    out.mkdir()
    link = tmp_path / "dirlink.moepack"
    link.symlink_to(out)
    for target in (out, link):
        for kw in ({}, {"force": True}, {"dry_run": True}, {"force": True, "dry_run": True}):
            with pytest.raises(ConvertError, match="is a directory; OUT must be"):
                convert(src, target, FAST, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.moepack", "dirlink.moepack"]


# -- 4. a source file changed during the run
class Toucher(Reporter):
    """Rewrites a source file in place (same size, new bytes) once the first experts are done;
    counts the experts done after that."""

    def __init__(self, path: Path) -> None:
        self.path, self.after = path, -1

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        if self.after >= 0:
            self.after += experts
        elif experts:
            self.after = 0
            data = bytearray(self.path.read_bytes())
            data[-1] ^= 0x01  # the last byte of the last tensor: still finite
            st = self.path.stat()
            self.path.write_bytes(bytes(data))
            os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize("interval", [0.0, 3600.0])  # seen at the next units / at finalize
def test_source_changed_during_the_run_is_refused(src, reference, tmp_path, monkeypatch,
                                                   interval):
    monkeypatch.setattr(pipeline._SourceWatch, "INTERVAL", interval)
    victim = _victim(tmp_path, src)
    shard = sorted(victim.glob("*.safetensors"))[0]
    out = tmp_path / "m.moepack"
    rep = Toucher(shard)
    with pytest.raises(ConvertError, match=f"{shard.name}: changed while it was converted"):
        convert(victim, out, FAST, reporter=rep, pause_per_unit=1e-6)
    assert rep.after == (0 if interval == 0 else 2 * LAYER_EXPERTS - 1)
    assert not out.exists() and not _partial(out).exists() and not _journal(out).exists()
    convert(victim, out, FAST)  # converts the file as it is now
    assert out.read_bytes() != reference


def test_unchanged_source_passes_the_final_check(src, reference, tmp_path):
    out = tmp_path / "u.moepack"
    convert(src, out, FAST)
    assert out.read_bytes() == reference


# -- 5. --dry-run and an existing partial
def test_dry_run_reports_the_partial_it_would_resume(src, tmp_path):
    out = tmp_path / "r.moepack"
    _interrupted(src, out, LAYER_EXPERTS)
    before = (_partial(out).read_bytes(), _journal(out).read_bytes())
    done = Journal.read_done(_journal(out))
    s = convert(src, out, FAST, dry_run=True)
    assert s.plan["units_done"] == len(done) > 0 and s.plan["resumes"] == str(_partial(out))
    assert s.plan["units_done"] < s.plan["units_total"]
    other = Settings(expert_preset="rvq3-baseline", iters=3, seed=3)
    with pytest.raises(ConvertError, match=r"settings\.seed: was 0, now 3.*--restart"):
        convert(src, out, other, dry_run=True)
    s = convert(src, out, other, dry_run=True, restart=True)  # --restart would start over
    assert s.plan["units_done"] == 0 and s.plan["resumes"] is None
    assert (_partial(out).read_bytes(), _journal(out).read_bytes()) == before
    r = _cli("convert", str(src), str(out), "--dry-run", "--json", "--expert-codec",
             "rvq3-baseline", "--iters", "3")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)["plan"]
    assert plan["units_done"] == len(done) and plan["resumes"] == str(_partial(out))
    r = _cli("convert", str(src), str(out), "--dry-run", "--expert-codec", "rvq3-baseline",
             "--iters", "3")
    assert r.exit_code == 0 and f"resumes {_partial(out)}: {len(done)} of " in r.stdout, r.output
    r = _cli("convert", str(src), str(out), "--dry-run", "--json", "--expert-codec",
             "rvq3-baseline", "--iters", "3", "--seed", "3")
    assert r.exit_code == 1 and "settings.seed: was 0, now 3" in r.output


# -- 6. --dry-run and free space
def test_dry_run_refuses_short_space_like_the_real_run(src, tmp_path, monkeypatch):
    out = tmp_path / "s.moepack"
    monkeypatch.setattr(pipeline.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    for dry in (True, False):
        with pytest.raises(ConvertError, match="not enough free space.*need"):
            convert(src, out, FAST, dry_run=dry)
    r = _cli("convert", str(src), str(out), "--dry-run")
    assert r.exit_code == 1 and "not enough free space" in r.output
    assert list(tmp_path.iterdir()) == []


# -- 7. INT4 weight_shape
def test_wrong_int4_weight_shape_is_refused_before_anything_is_written(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    ck = make_checkpoint("kimi_k25", tmp_path / "k", int4_group=4, tokenizer=False)
    index = json.loads((ck / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(n for n in index if n.endswith("experts.0.up_proj.weight_shape"))
    shard = ck / index[name]
    tensors = load_file(shard)
    tensors[name] = torch.tensor([5, 7], dtype=tensors[name].dtype)
    save_file(tensors, shard, metadata={"format": "pt"})
    out = tmp_path / "o.moepack"
    for dry in (True, False):
        with pytest.raises(ConvertError, match=f"{name}' says \\[5, 7\\]"):
            convert(ck, out, FAST, dry_run=dry)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def _cli(*args: str):
    from typer.testing import CliRunner

    from moepack.cli import app

    return CliRunner().invoke(app, list(args))
