"""What `convert`, `export`, `plan --config` and `info` accept as input and what they say about
it: tokenizer files checked as the runtime reads them, checkpoint tensors the config does not
describe refused or listed, option values refused as usage errors (exit 2) naming the option,
messages that say what a path is, help text that survives rich markup, IDs never cut."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hostile_snapshot import assert_one_line_error, changes, cli, only_line, snapshot
from moepack.convert.errors import ConvertError
from moepack.convert.resume import check_same
from moepack.format import Container
from safetensors.numpy import save_file
from tiny_models import make_checkpoint

FAST = ("--expert-codec", "rvq3-baseline", "--iters", "2", "-q")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_checkpoint("mixtral", tmp_path_factory.mktemp("inputs") / "ck")


@pytest.fixture
def src(base: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint (each test may damage it)."""
    return Path(shutil.copytree(base, tmp_path / "src"))


def _refused(src: Path, out: Path, code: int, needle: str, *args: str) -> str:
    """convert SRC OUT fails with `code`, one line holding `needle`, and writes nothing."""
    before = snapshot(out.parent, skip=src)
    rc, output = cli("convert", *FAST, *args, src, out)
    assert_one_line_error(rc, output, code, needle)
    assert changes(before, snapshot(out.parent, skip=src)) == set()
    return only_line(output)


# -- tokenizer files (defect: a broken tokenizer converted, then `run` failed) -------------------

@pytest.mark.parametrize(("name", "data"), [
    ("tokenizer.json", b"not json at all"),
    ("tokenizer.json", bytes(range(256)) * 16),
    ("tokenizer.json", b"[" * 100_000 + b"]" * 100_000),
    ("tokenizer.json", b'{"version": "1.0"}'),  # JSON, but no tokenizer
    ("tokenizer_config.json", b"{{"),
    ("tokenizer_config.json", b"[" * 1000 + b"]" * 1000),
    ("tokenizer_config.json", b"[]"),
    ("generation_config.json", b"nope"),
    ("special_tokens_map.json", b"{"),
    ("chat_template.jinja", b"\xff\xfe\x00binary"),
])
def test_a_broken_tokenizer_file_is_refused_before_anything_is_written(
        src: Path, tmp_path: Path, name: str, data: bytes) -> None:
    (src / name).write_bytes(data)
    line = _refused(src, tmp_path / "o.moepack", 1, name)
    assert line.startswith(f"error: {name}: "), line


def test_a_tokenizer_config_beyond_the_runtime_bound_is_refused(
        src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moepack.runtime import tokenizer

    monkeypatch.setattr(tokenizer, "MAX_CONFIG_BYTES", 100)
    _refused(src, tmp_path / "o.moepack", 1, "tokenizer_config.json: 196 bytes, larger than")


def test_a_tokenizer_file_that_is_a_fifo_is_refused_not_skipped(src: Path,
                                                                tmp_path: Path) -> None:
    (src / "tokenizer.json").unlink()
    os.mkfifo(src / "tokenizer.json")
    _refused(src, tmp_path / "o.moepack", 1, "tokenizer.json: not a regular file (a FIFO)")


def test_a_dry_run_checks_the_tokenizer_too(src: Path, tmp_path: Path) -> None:
    (src / "tokenizer.json").write_text("{")
    rc, output = cli("convert", "--dry-run", src, tmp_path / "o.moepack")
    assert_one_line_error(rc, output, 1, "tokenizer.json: ")


# -- tensors the config does not describe -------------------------------------------------------

def _add_tensors(src: Path, tensors: dict[str, np.ndarray]) -> None:
    save_file(tensors, src / "model-extra.safetensors")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"].update(dict.fromkeys(tensors, "model-extra.safetensors"))
    (src / "model.safetensors.index.json").write_text(json.dumps(index))


def test_layers_beyond_num_hidden_layers_are_refused(src: Path, tmp_path: Path) -> None:
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    line = _refused(src, tmp_path / "o.moepack", 1, "'num_hidden_layers' is 1")
    assert "layer 1 " in line and "model.layers.1." in line, line
    rc, output = cli("convert", "--dry-run", src, tmp_path / "o.moepack")
    assert_one_line_error(rc, output, 1, "'num_hidden_layers' is 1")


def test_stray_tensors_are_warned_about_and_listed(src: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _add_tensors(src, {"extra.weight": np.zeros(3, np.float64),
                       "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32),
                       "model.layers.1.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)})
    out = tmp_path / "o.moepack"
    rc, output = cli("convert", *FAST, src, out)  # --quiet: warnings still show
    assert rc == 0, output
    warning = only_line(output)
    assert warning.startswith("warning: 3 checkpoint tensors"), warning
    assert "'extra.weight'" in warning
    assert "'model.layers.*.self_attn.rotary_emb.inv_freq' (x2)" in warning
    with Container.open(out) as c:
        (note,) = c.manifest["source"]["skipped"]
    assert note in warning and "'extra.weight'" in note
    monkeypatch.setenv("COLUMNS", "80")
    rc, output = cli("info", out)
    assert rc == 0 and "not converted" in output and "'extra.weight'" in output


def test_a_checkpoint_that_uses_every_tensor_has_no_note(src: Path, tmp_path: Path) -> None:
    rc, output = cli("convert", *FAST, src, tmp_path / "o.moepack")
    assert rc == 0 and output == "", output
    with Container.open(tmp_path / "o.moepack") as c:
        assert "skipped" not in c.manifest["source"]


# -- option values: usage errors at parse time --------------------------------------------------

@pytest.mark.parametrize(("args", "option", "needle"), [
    (("--sample", "0"), "--sample", "from 1 to"),
    (("--sample", "-3"), "--sample", "from 1 to"),
    (("--iters", "0"), "--iters", "from 1 to"),
    (("--iters", "-1"), "--iters", "from 1 to"),
    (("--progress", "foo"), "--progress", "bars, lines, json"),
    (("--expert-codec", "rvq9"), "--expert-codec", "rvq3-l"),
    (("--trunk-codec", "q5"), "--trunk-codec", "q8"),
    (("--codec", "foo=q8"), "--codec", "attn"),
    (("--codec", "attn"), "--codec", "CLASS=CODEC"),
    (("--codec", "attn=q5"), "--codec", "q6"),
    (("--codec", "codebook=q8"), "--codec", "f32, f16"),
    (("--mtp", "foo"), "--mtp", "keep, drop"),
    (("--alignment", "1000"), "--alignment", "power of two from 512"),
    (("--seed", "99999999999999999999999"), "--seed", "0 to 9223372036854775807"),
    (("--seed", "-1"), "--seed", "0 to 9223372036854775807"),
    (("--staging", "0"), "--staging", "0 bytes"),
    (("--progress-every", "nan"), "--progress-every", "not a finite number"),
    (("--progress-every", "-inf"), "--progress-every", "not a finite number"),
    (("--progress-every", "-1"), "--progress-every", "below 0"),
])
def test_bad_option_values_are_usage_errors(src: Path, tmp_path: Path, args: tuple,
                                            option: str, needle: str) -> None:
    before = snapshot(tmp_path)
    rc, output = cli("convert", src, tmp_path / "o.moepack", *args)
    line = only_line(output)
    assert rc == 2 and line.startswith(f"usage: Invalid value for '{option}'"), output
    assert needle in line, line
    assert changes(before, snapshot(tmp_path)) == set()


@pytest.mark.parametrize("out", ["", ".", "..", "/"])
def test_an_out_that_names_no_file_is_a_usage_error(src: Path, out: str) -> None:
    rc, output = cli("convert", src, out)
    assert rc == 2 and only_line(output).startswith("usage: Invalid value for 'out'"), output


def test_conflicting_options_are_usage_errors(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.moepack"
    for args, needle in ((("--ray", "auto", "--jobs", "2"), "exclude each other"),
                         (("--staging", "1G"), "--staging is for hf:")):
        rc, output = cli("convert", src, out, *args)
        assert rc == 2 and needle in only_line(output), output
    rc, output = cli("convert", "hf:org/repo", out)
    assert rc == 2 and "need --staging" in only_line(output), output


@pytest.mark.parametrize(("args", "option"), [
    (("--shard-gb", "0"), "--shard-gb"), (("--shard-gb", "-1"), "--shard-gb"),
    (("--shard-gb", "nan"), "--shard-gb"), (("--shard-gb", "inf"), "--shard-gb"),
    (("--dtype", "f8"), "--dtype"),
])
def test_bad_export_options_are_usage_errors(tmp_path: Path, args: tuple, option: str) -> None:
    rc, output = cli("export", tmp_path / "m.moepack", tmp_path / "hf", *args)
    assert rc == 2, output
    assert only_line(output).startswith(f"usage: Invalid value for '{option}'"), output
    rc, output = cli("export", tmp_path / "m.moepack", "")
    assert rc == 2 and "'outdir'" in only_line(output), output


def test_plan_config_codecs_are_usage_errors(base: Path) -> None:
    rc, output = cli("plan", "--config", base / "config.json", "--expert-codec", "zz")
    assert rc == 2 and "'--expert-codec'" in only_line(output), output


# -- plan --config reads config.json as convert does --------------------------------------------

def test_plan_config_nested_deep_is_one_error_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    rc, output = cli("plan", "--config", deep)
    assert_one_line_error(rc, output, 1, f"{deep}: not readable JSON: JSON nested deeper than 64")


def test_plan_config_errors_name_the_file_once(base: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "x" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({**json.loads((base / "config.json").read_text()),
                                "architectures": ["Nope"]}))
    rc, output = cli("plan", "--config", cfg)
    line = only_line(output)
    assert rc == 1 and line.startswith(f"error: {cfg}: unsupported architecture"), line
    assert line.count("config.json") == 1, line


# -- messages that say what a path is -----------------------------------------------------------

def _shard2(src: Path) -> Path:
    return src / "model-00002-of-00002.safetensors"


@pytest.mark.parametrize(("make", "needle"), [
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
    (lambda p: p.mkdir(), "is a directory, not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "is a character device (a symbolic link to "
                                          "'/dev/zero'), not a regular file"),
    (lambda p: p.symlink_to(p.parent / "gone"), "is a symbolic link to a missing file"),
])
def test_a_shard_that_is_not_a_file_is_named_for_what_it_is(src: Path, tmp_path: Path,
                                                            make, needle: str) -> None:
    _shard2(src).unlink()
    make(_shard2(src))
    line = _refused(src, tmp_path / "o.moepack", 1, needle)
    assert "listed in model.safetensors.index.json but" in line


def test_an_out_inside_a_file_says_it_is_not_a_directory(src: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    _refused(src, tmp_path / "afile" / "o.moepack", 1, f"{tmp_path / 'afile'}: not a directory")
    _refused(src, tmp_path / "nope" / "o.moepack", 1, f"{tmp_path / 'nope'}: no such directory")


def test_export_into_a_file_says_it_is_not_a_directory(tmp_path: Path) -> None:
    from spec_vectors import VECTORS

    (tmp_path / "afile").write_text("x")
    rc, output = cli("export", VECTORS / "valid" / "blobs.moepack", tmp_path / "afile" / "hf")
    assert_one_line_error(rc, output, 1, f"{tmp_path / 'afile'} is not a directory")


def _header(files: list[tuple[str, int, str]], iters: int = 3) -> dict:
    return {"source": [{"name": n, "size": s, "sha256": h} for n, s, h in files],
            "settings": {"iters": iters}, "converter": "0.1.0", "layout": "L" + str(iters)}


def test_a_changed_source_is_named_by_file_and_restart_suggested() -> None:
    old = _header([("a.safetensors", 10, "1" * 64), ("b.safetensors", 20, "2" * 64)])
    new = _header([("a.safetensors", 10, "1" * 64), ("b.safetensors", 20, "3" * 64),
                   ("c.safetensors", 5, "4" * 64)])
    with pytest.raises(ConvertError) as e:
        check_same(old, new, Path("o.moepack.partial"))
    msg = str(e.value)
    assert "'b.safetensors' has other contents" in msg and "'c.safetensors' is new" in msg
    assert "source[" not in msg and "layout" not in msg and "--restart" in msg
    with pytest.raises(ConvertError, match=r"settings\.iters: was 3, now 4.*original settings"):
        check_same(old, {**old, **_header([], 4), "source": old["source"]},
                   Path("o.moepack.partial"))


# -- help text and info output ------------------------------------------------------------------

def test_no_help_text_is_eaten_by_rich_markup() -> None:
    """Help text is rendered as rich markup, where `[cluster]` or `[@REV]` is a tag: every
    command's and option's help must render to itself (a literal bracket is written `\\[`)."""
    import typer
    from rich.markup import render

    from moepack.cli import app

    def texts(cmd, path: str):
        yield path, cmd.help or ""
        for p in cmd.params:
            yield f"{path} {p.name}", getattr(p, "help", None) or ""
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from texts(sub, f"{path} {name}")

    eaten = [where for where, text in texts(typer.main.get_command(app), "moepack")
             if render(text).plain != text.replace("\\[", "[")]
    assert eaten == []


def test_info_never_cuts_the_id_or_the_path(src: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _add_tensors(src, {"extra.weight": np.zeros(3, np.float32)})  # a long "not converted" row
    out = tmp_path / ("a_rather_long_directory_name_for_models" * 2) / "o.moepack"
    out.parent.mkdir()
    rc, output = cli("convert", *FAST, src, out)
    assert rc == 0, output
    with Container.open(out) as c:
        cid = c.id
    monkeypatch.setenv("COLUMNS", "80")
    rc, output = cli("info", out)
    assert rc == 0 and "…" not in output, output
    assert cid in output and str(out) in output, output


def test_convert_and_info_report_bits_per_weight_alike(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.moepack"
    rc, output = cli("convert", "--expert-codec", "rvq3-baseline", "--iters", "2",
                     "--progress", "json", src, out)
    assert rc == 0, output
    said = re.search(r"([0-9.]+) bits/weight \(whole file\)", output)
    rc, info = cli("info", out)
    assert said and rc == 0, output + info
    assert re.search(rf"whole file\s+{re.escape(said.group(1))} ", info), info
    rc, dry = cli("convert", "--dry-run", "--expert-codec", "rvq3-baseline", "--iters", "2", src,
                  tmp_path / "p.moepack")
    assert f"bits per weight: {said.group(1)} whole file" in dry, dry
