"""Hostile input to `run`, `chat` and `eval` on a real (tiny) container (issue 13): prompts that
are not UTF-8, token ids out of range, `--logits` into a missing folder or through a planted
link, and weights that make the logits NaN. Each case: the documented message and exit code
(docs/RUNTIME.md, "Exit codes"), one line, no traceback, nothing created outside the
destination."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import blake3
import numpy as np
import pytest
from hostile_snapshot import snapshot
from spec_vectors import load_generator
from tiny_models import make_checkpoint
from typer.testing import CliRunner

from moepack.cli import app

runner = CliRunner()
NONFINITE = "the model produced a non-finite logit (NaN or Inf) at position"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("hostile_model")
    make_checkpoint("mixtral", d / "src", max_position_embeddings=128)
    convert(d / "src", d / "m.moepack", Settings())
    return d / "m.moepack"


@pytest.fixture(scope="module")
def nan_model(model, tmp_path_factory) -> Path:
    """The same container with one NaN in a norm tensor, resealed: every hash matches, so it
    opens and verifies; only the numbers are poison."""
    gen = load_generator()
    data = bytearray(model.read_bytes())
    doc = gen.index_doc(bytes(data))
    sec = gen.section(doc, "layers.0.attn_norm")
    assert sec["codec"]["name"] == "f32"
    off, length = sec["offset"], sec["length"]
    data[off:off + 4] = struct.pack("<f", float("nan"))
    sec["hash"] = blake3.blake3(bytes(data[off:off + length])).hexdigest()
    out = tmp_path_factory.mktemp("nan_model") / "nan.moepack"
    out.write_bytes(gen.reseal(bytes(data), doc))
    return out


def _last_line(text: str) -> str:
    """The output's last line (streamed tokens may come before an error), asserting no
    traceback and that the error is on a single line."""
    assert "Traceback" not in text, text
    return text.strip().splitlines()[-1]


def _moepack(args: list, cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """A real process: argv carries raw bytes (os.fsencode'd), as a shell would pass them."""
    argv = [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run([sys.executable, "-m", "moepack", *argv], cwd=cwd, input=stdin,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)


# --- prompts that are not UTF-8: refused, never guessed ------------------------------------

def test_prompt_bytes_that_are_not_utf8(model, tmp_path):
    r = _moepack(["run", model, b"w5 \xff w6", "-n", "2"], tmp_path)
    assert r.returncode == 2
    line = _last_line(r.stdout.decode())
    assert line.startswith("usage: Invalid value for 'prompt': the text is not valid UTF-8 "
                           "(byte 0xff at character 3)"), line
    assert list(tmp_path.iterdir()) == []


def test_system_message_that_is_not_utf8(model):
    r = runner.invoke(app, ["chat", str(model), "--system", "be \udcfe brief"], input="w5\n")
    assert r.exit_code == 2
    assert _last_line(r.output).startswith(
        "usage: Invalid value for '--system': the text is not valid UTF-8 (byte 0xfe")


def test_chat_line_that_is_not_utf8_ends_the_chat(model, tmp_path):
    r = _moepack(["chat", model, "-n", "2"], tmp_path, stdin=b"w5 \xe9t\xe9\n")
    assert r.returncode == 1
    assert _last_line(r.stdout.decode()).endswith(
        "error: input is not valid UTF-8 (byte 0xe9 at character 3); "
        "moepack reads text as UTF-8 only")


def test_tokenizer_refuses_lone_surrogates(model):
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError

    tok = Tokenizer.from_container(str(model))
    with pytest.raises(TokenizerError, match="not valid UTF-8"):
        tok.encode("w5 \udcff")  # the tokenizers library raised a bare TypeError here


# --- token ids -----------------------------------------------------------------------------

def test_token_id_beyond_the_vocabulary(model):
    r = runner.invoke(app, ["run", str(model), "--tokens", "5,67", "-n", "1"])
    assert r.exit_code == 1
    assert _last_line(r.output) == "error: token ids must be in 0..66"


@pytest.mark.parametrize("bad", ["5,2147483648", "5,99999999999999999999", "1," + "9" * 5000,
                                 "5,-1", "5,0x10"])
def test_token_id_beyond_int32_is_a_usage_error(model, bad):
    r = runner.invoke(app, ["eval", str(model), "--tokens", bad, "--logits", "x.npy"])
    assert r.exit_code == 2
    line = _last_line(r.output)
    assert line.startswith("usage: Invalid value for '--tokens': ")
    assert "is not a token id: give comma-separated integers from 0 to 2147483647" in line
    assert len(line) < 300  # a 5000-digit id is quoted cut short


# --- --logits: the folder must exist; a planted link is replaced, not followed ------------

def test_logits_into_a_missing_folder(model, tmp_path):
    before = snapshot(tmp_path)
    out = tmp_path / "no" / "such" / "l.npy"
    r = runner.invoke(app, ["eval", str(model), "--tokens", "1,5", "--logits", str(out)])
    assert r.exit_code == 2
    assert _last_line(r.output).startswith(
        f"usage: Invalid value for '--logits': folder {out.parent} does not exist")
    assert snapshot(tmp_path) == before


def test_logits_onto_a_folder(model, tmp_path):
    r = runner.invoke(app, ["eval", str(model), "--tokens", "1,5", "--logits", str(tmp_path)])
    assert r.exit_code == 2
    assert f"{tmp_path} is a folder" in _last_line(r.output)


def test_logits_through_a_planted_link(model, tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("precious")
    (dest / "l.npy").symlink_to(victim)
    before = snapshot(outside)
    r = runner.invoke(app, ["eval", str(model), "--tokens", "1,5,9", "--logits",
                            str(dest / "l.npy")])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "precious" and snapshot(outside) == before
    assert not (dest / "l.npy").is_symlink()
    assert np.load(dest / "l.npy").shape == (3, 67)
    assert sorted(p.name for p in dest.iterdir()) == ["l.npy"]


# --- weights that make the logits NaN ------------------------------------------------------

def test_run_on_nan_weights_fails_instead_of_printing_garbage(nan_model, tmp_path):
    r = _moepack(["run", nan_model, "w5 w6", "-n", "4"], tmp_path)
    assert r.returncode == 1
    line = _last_line(r.stdout.decode())
    # <s> w5 w6: the prompt's logits are those of its last position
    assert line.startswith(f"error: {NONFINITE} 2 (vocabulary entry 0)"), line
    assert "a weight in the container is NaN/Inf" in line
    assert list(tmp_path.iterdir()) == []


def test_eval_on_nan_weights_writes_nothing(nan_model, tmp_path):
    r = runner.invoke(app, ["eval", str(nan_model), "--tokens", "1,5",
                            "--logits", str(tmp_path / "l.npy")])
    assert r.exit_code == 1
    assert _last_line(r.output).startswith(f"error: {NONFINITE} 0 ")  # the first row fails
    assert list(tmp_path.iterdir()) == []


def test_chat_on_nan_weights(nan_model):
    r = runner.invoke(app, ["chat", str(nan_model), "-n", "2"], input="w5\n")
    assert r.exit_code == 1
    # stdout's prompt "> " and stderr share the line when both go to one pipe
    assert _last_line(r.output).removeprefix("> ").startswith(f"error: {NONFINITE} 0 ")


def test_engine_keeps_the_sequence_after_nonfinite_logits(nan_model):
    """All or nothing, as for any failed mp_eval: the position is where the call started."""
    from moepack.runtime.engine import Engine, NonFiniteError

    with Engine(nan_model, threads=1) as e:
        for call in (lambda: e.feed([1, 5, 9]), lambda: e.logits([1, 5])):
            with pytest.raises(NonFiniteError, match="non-finite logit"):
                call()
            assert e.position == 0


def test_container_name_that_is_not_utf8(model, tmp_path):
    """A file name with undecodable bytes is a valid path: run opens it (os.fsencode, not
    UTF-8) and an error about it is one printable line."""
    odd = tmp_path / os.fsdecode(b"m\xff.moepack")
    shutil.copyfile(model, odd)
    r = _moepack(["run", os.fsencode(odd), "--tokens", "1,5", "-n", "1", "--json"], tmp_path)
    assert r.returncode == 0, r.stdout
    odd.unlink()
    r = _moepack(["plan", os.fsencode(odd)], tmp_path)
    assert r.returncode == 1
    assert _last_line(r.stdout.decode()) == (
        f"error: container {tmp_path}/m\\udcff.moepack: No such file or directory")


def test_names_from_the_file_cannot_drive_the_terminal(model, tmp_path, monkeypatch):
    """`info` shows the path and the container's strings escaped; generated text keeps newlines
    and tabs but escapes other control characters (the vocabulary comes from the container)."""
    from moepack.cliargs import terminal_text

    monkeypatch.chdir(tmp_path)  # a short path: the table would cut a long one
    shutil.copyfile(model, "ev\x1b[31mil.moepack")
    r = runner.invoke(app, ["info", "ev\x1b[31mil.moepack"])
    assert r.exit_code == 0 and "\x1b" not in r.output and "ev\\x1b[31mil" in r.output
    assert terminal_text("a\x1b]0;title\x07b\nc\td\x9b") == "a\\x1b]0;title\\x07b\nc\td\\x9b"


def test_logits_on_a_full_disk_leave_no_partial_file(model, tmp_path):
    """RLIMIT_FSIZE stands in for a full disk (EFBIG; Python ignores SIGXFSZ): one line, exit 1,
    no truncated .npy left where a reader would take it for the result, and the earlier file at
    that path as it was (it was removed before the write)."""
    import resource

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    ids = ",".join(str(3 + i % 60) for i in range(8))  # 8 x 67 float32: about 2 KiB
    cmd = [sys.executable, "-m", "moepack", "eval", str(model), "--tokens", ids,
           "--logits", str(tmp_path / "l.npy")]
    r = subprocess.run(cmd, cwd=tmp_path, preexec_fn=small_files, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    assert r.returncode == 1
    assert _last_line(r.stdout.decode()) == (
        f"error: cannot write {tmp_path}/l.npy: File too large")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "l.npy").write_bytes(b"earlier")
    r = subprocess.run(cmd, cwd=tmp_path, preexec_fn=small_files, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    assert r.returncode == 1 and list(tmp_path.iterdir()) == [tmp_path / "l.npy"]
    assert (tmp_path / "l.npy").read_bytes() == b"earlier"


def test_deeply_nested_tokenizer_files_are_one_error():
    """A container's tokenizer blobs are untrusted JSON: nesting too deep is TokenizerError (one
    `error:` line in the CLI), not a RecursionError or a crash in the Rust parser."""
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError, _parse_config

    with pytest.raises(TokenizerError,
                       match="tokenizer_config.json: JSON nested deeper than 64 levels"):
        _parse_config(b"[" * 200_000, "m.moepack")
    with pytest.raises(TokenizerError, match="tokenizer.json: recursion limit exceeded"):
        Tokenizer(b'{"model":' + b"[" * 200_000)


@pytest.mark.parametrize(("template", "error"), [("{{ 1 + 'a' }}", "TypeError"),
                                                ("{{ 1 // 0 }}", "ZeroDivisionError")])
def test_a_failing_chat_template_is_one_error(model, template, error):
    """The chat template is the container's code: whatever it raises is TokenizerError."""
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError

    tok = Tokenizer.from_container(str(model))
    tok.chat_template = template
    with pytest.raises(TokenizerError, match=f"^chat template: {error}: "):
        tok.render_chat([{"role": "user", "content": "w5"}])


def test_tokenizer_config_fields_of_the_wrong_type(model):
    """Special tokens and named templates of the wrong JSON type are ignored, a template that is
    not text fails as TokenizerError: no TypeError from the config."""
    from moepack.format.reader import Container
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError

    with Container.open(model) as c:
        tokenizer_json = bytes(c.blob("tokenizer.json"))
    tok = Tokenizer(tokenizer_json, {
        "bos_token": {"content": 5}, "eos_token": [1],
        "chat_template": [{"name": ["x"], "template": "a"}, {"name": "default", "template": 5}]})
    assert tok.bos_id is None and tok.eos_id is None
    with pytest.raises(TokenizerError, match="^chat template: TypeError"):
        tok.render_chat([{"role": "user", "content": "w5"}])
